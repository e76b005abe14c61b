"""How the optimizer update runs over the master shards, once gradients are reduced.

`InMemoryStep` is the plain case: master weights and optimizer state sit in memory (on the device,
or in host buffers under CPU offload), one `optimizer.step()` updates them all. NVMe offload swaps
them through files instead (offload.optimizer_swap.SwappedStep); both offer the same methods, so
ZeroOptimizer composes one of them and never branches on where the state lives. An optimizer
that needs whole tensors (whole_tensors.py) is stepped through its step_on_shards by both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class InMemoryStep:
    where = "device"  # where master weights and optimizer state live: "device" or "cpu" (offload)

    def __init__(self, optimizer: torch.optim.Optimizer, groups: list[Any], offloaded: bool, shards: Any = None):
        self.optimizer = optimizer
        self.groups = groups
        self.where = "cpu" if offloaded else "device"
        self.shards = shards

    def step(self, grads: list[torch.Tensor]) -> None:
        """Update every master shard from its gradient and copy it into the model's shard."""
        for group, grad in zip(self.groups, grads):
            group.master_param.grad = grad
        run_optimizer(self.optimizer, self.shards)
        for group in self.groups:
            group.master_param.grad = None
            group.master_to_model()

    @contextmanager
    def resident(self, write_back: bool = False) -> Iterator[None]:
        """Master weights and optimizer state readable (and writable) in memory for the duration."""
        yield

    def state_bytes(self) -> int:
        total = 0
        for per_param in self.optimizer.state.values():
            for value in per_param.values():
                if torch.is_tensor(value):
                    total += value.numel() * value.element_size()
        return total

    def master_bytes(self) -> int:
        return sum(g.master.numel() * g.master.element_size() for g in self.groups if g.separate_master)

    def buffer_bytes(self) -> int:
        return 0

    def resident_state_bytes(self) -> int:
        return 0  # all of the state is counted at `where`


def run_optimizer(optimizer: torch.optim.Optimizer, shards: Any) -> None:
    """The optimizer's update of every master shard with a gradient: its whole-tensor step when it
    takes one (shards: a whole_tensors.TensorShards), else its own step()."""
    if shards is None:
        optimizer.step()
    else:
        optimizer.step_on_shards(shards)
