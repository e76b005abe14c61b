"""Run by test_init under torchrun: the real launch path, environment only."""

import os

import torch

import dscomm

dscomm.init_distributed()
dscomm.init_distributed()  # twice is harmless
t = torch.tensor([float(dscomm.get_rank() + 1)])
dscomm.all_reduce(t)
print(f"rank={dscomm.get_rank()} world={dscomm.get_world_size()} local={dscomm.get_local_rank()} "
      f"sum={int(t.item())} backend={dscomm.get_backend()} env_rank={os.environ['RANK']}", flush=True)
dscomm.destroy()
