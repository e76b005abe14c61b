"""A small training script for the autotuner's tests: it trains a tiny model for --steps optimizer steps,
and fails on purpose at chosen micro-batch sizes (read from the config each experiment is given):
--crash-at raises, --oom-at asks the allocator for more memory than any machine has (a real failed
allocation), --hang-at sleeps past the autotuner's timeout."""

import argparse
import time

import torch

import dstrain

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--crash-at", type=int, default=0)
parser.add_argument("--oom-at", type=int, default=0)
parser.add_argument("--hang-at", type=int, default=0)
args = dstrain.add_config_arguments(parser).parse_args()

dstrain.init_distributed()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
data = [(torch.randn(16), torch.randn(1)) for _ in range(512)]
engine, _, loader, _ = dstrain.initialize(args=args, model=model, model_parameters=model.parameters(),
                                          training_data=data)
micro = engine.train_micro_batch_size_per_gpu()
if micro == args.crash_at:
    raise RuntimeError(f"deliberate crash at micro-batch {micro}")
if micro == args.oom_at:
    torch.empty(1 << 47, dtype=torch.uint8)  # 128 TiB: the allocator refuses it
if micro == args.hang_at:
    time.sleep(3600)
batches = dstrain.RepeatingLoader(loader)
while engine.global_steps < args.steps:
    x, y = next(batches)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
print(f"trained {engine.global_steps} steps at micro-batch {micro}", flush=True)
