"""A training script written for DeepSpeed, using only deepspeed.* names (the test swaps the import)."""

import argparse
import json
import os

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--out", required=True)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 1)

    def forward(self, x):
        h = deepspeed.checkpointing.checkpoint(lambda t: torch.relu(self.a(t)), x)
        return self.b(h)


model = Net()
data = [(torch.randn(16), torch.randn(1)) for _ in range(256)]
engine, optimizer, loader, scheduler = deepspeed.initialize(args=args, model=model,
                                                            model_parameters=model.parameters(),
                                                            training_data=data)
deepspeed.checkpointing.configure(None, deepspeed_config=args.deepspeed_config)
losses = []
for x, y in loader:
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
engine.save_checkpoint(os.path.join(args.out, "ckpt"), client_state={"epoch": 1})
_, client = engine.load_checkpoint(os.path.join(args.out, "ckpt"))
with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
    total = sum(p.sum().item() for p in engine.module.parameters())
if deepspeed.comm.get_rank() == 0:
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"losses": losses, "client": client, "steps": engine.global_steps, "lr": engine.get_lr(),
                   "world": deepspeed.comm.get_world_size(), "stage": engine.zero_optimization_stage(),
                   "weights": total}, f)
