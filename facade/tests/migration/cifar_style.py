"""A training script written the way DeepSpeed's examples are, unchanged: it imports `deepspeed`.

It touches each DeepSpeed module path dstrain maps and each behaviour the migration relies on, and
writes what it saw to --out/result_<rank>.json for the test to check.
"""

import argparse
import json
import os
import warnings

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.lr_schedules import WARMUP_MAX_LR, WarmupLR, add_tuning_arguments
from deepspeed.runtime.utils import set_random_seed
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
from deepspeed.utils import (
    RepeatingLoader,
    groups,
    log_dist,
    logger,
    safe_get_full_fp32_param,
    safe_get_full_grad,
)

parser = argparse.ArgumentParser(description="CIFAR-style")
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--out", required=True)
parser = deepspeed.add_config_arguments(parser)
parser = add_tuning_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
accelerator = get_accelerator()
device = accelerator.device_name(args.local_rank)
set_random_seed(1234)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.head(deepspeed.checkpointing.checkpoint(lambda t: torch.relu(self.body(t)), x))


net = Net()
# Two groups with their own learning rates; WarmupLR without warmup_max_lr must keep each group's own.
parameters = [{"params": net.body.parameters(), "lr": 0.02}, {"params": net.head.parameters(), "lr": 0.01}]
optimizer = FusedAdam(parameters, lr=0.05)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=net, optimizer=optimizer,
                                                   lr_scheduler=lambda opt: WarmupLR(opt, warmup_num_steps=4))
client_wins = [str(w.message) for w in caught if "passed to initialize()" in str(w.message)]
data = [(torch.randn(8), torch.randint(0, 2, ())) for _ in range(64)]
loader = RepeatingLoader(engine.deepspeed_io(data))
start = accelerator.Event(enable_timing=True)
end = accelerator.Event(enable_timing=True)
start.record()
grad_norm_seen = None
for step, (x, y) in enumerate(loader):
    if step == 12:
        break
    loss = torch.nn.functional.cross_entropy(engine(x.to(device)), y.to(device))
    engine.backward(loss)
    if step == 0:
        grad_norm_seen = float(safe_get_full_grad(net.head.weight).norm())
    engine.step()
end.record()
accelerator.synchronize()
tensor = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(tensor)
pair = dist.new_group([0, 1])
dist.barrier(group=pair)
log_dist(f"trained {engine.global_steps} steps", ranks=[0])
logger.info("cifar-style done")
engine.save_checkpoint(os.path.join(args.out, "ckpt"), client_state={"args": args})
_, client = engine.load_checkpoint(os.path.join(args.out, "ckpt"))
result = {
    "device": device, "backend": accelerator.communication_backend_name(), "elapsed_ok": start.elapsed_time(end) >= 0,
    "lrs": engine.get_lr(), "client_wins": client_wins, "optimizer": type(engine.basic_optimizer).__name__,
    "sum": tensor.item(), "global_rank_of_1": dist.get_global_rank(pair, 1), "dp": groups.get_data_parallel_world_size(),
    "steps": engine.global_steps, "client_args_out": client["args"].out, "grad_norm": grad_norm_seen,
    "head_weight_sum": float(safe_get_full_fp32_param(net.head.weight).sum()),
    "cpu_adam": DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(2))]).defaults["adamw_mode"],
    "offload_enum": OffloadDeviceEnum.cpu.value, "config_class": DeepSpeedConfig.__name__,
    "warmup_key": WARMUP_MAX_LR,
}
with open(os.path.join(args.out, f"result_{dist.get_rank()}.json"), "w") as handle:
    json.dump(result, handle)
dist.destroy_process_group()
