"""NVMe optimizer offload: master weights and optimizer state live in a swap file between steps.

Groups (stage-3 units, or stage 1-2 flat groups) are packed in order into sub-groups of about
`sub_group_size` elements (a group larger than that is a sub-group of its own). Each sub-group's
master weights, and each optimizer state tensor of it (Adam: exp_avg, exp_avg_sq), are one
contiguous region of the file. A step takes every sub-group in turn: read its regions into host
buffers from a pool of `buffer_count`, point the master parameters and the optimizer state at
them, run `optimizer.step()` (which skips every parameter without a gradient, so only this
sub-group moves), copy the masters into the model's shards, then write the regions back
asynchronously; a write finishes while the next sub-group is read and stepped.

Between steps the masters and state tensors are empty placeholders; `resident()` brings them in
whole (for state_dict, checkpoints, loading). State named in `keep_in_memory` (Muon's momentum
buffer under zero_optimization.save_muon_momentum_buffer_in_memory) is never swapped: it stays in
host memory, so a whole-tensor step reads no file for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from dsconfig import OffloadOptimizerConfig

from ..errors import ZeroConfigError
from ..steps import run_optimizer
from .swap import BufferPool, SwapFile, nvme_dir

KEY = "zero_optimization.offload_optimizer"
MASTER = "master"


class SubGroup:
    """Consecutive groups whose master and state tensors are swapped together."""

    def __init__(self, members: list[int], numels: list[int]):
        self.members = members
        self.offsets = [sum(numels[:i]) for i in range(len(numels))]  # elements, within the sub-group
        self.numels = numels
        self.numel = sum(numels)
        self.regions: dict[str, tuple[int, int]] = {}  # tensor kind -> (file offset, bytes)


def pack(numels: list[int], sub_group_size: int) -> list[SubGroup]:
    subgroups, members, sizes = [], [], []
    for index, numel in enumerate(numels):
        if members and sum(sizes) + numel > sub_group_size:
            subgroups.append(SubGroup(members, sizes))
            members, sizes = [], []
        members.append(index)
        sizes.append(numel)
    if members:
        subgroups.append(SubGroup(members, sizes))
    return subgroups


class SwappedStep:
    where = "nvme"

    def __init__(self, optimizer: torch.optim.Optimizer, groups: list[Any], config: OffloadOptimizerConfig,
                 sub_group_size: int, rank: int, aio_kwargs: dict[str, Any] | None, *, shards: Any = None,
                 keep_in_memory: Sequence[str] = ()):
        self.optimizer = optimizer
        self.groups = groups
        self.shards = shards  # a whole_tensors.TensorShards for an optimizer that steps on shards
        self.keep_in_memory = frozenset(keep_in_memory)
        self.config = config
        self.sub_group_size = sub_group_size
        self.swap = SwapFile(nvme_dir(config.nvme_path), "optimizer", rank, aio_kwargs, KEY)
        self.subgroups = pack([g.shard_numel for g in groups], max(int(sub_group_size), 1))
        self.where_is: dict[int, tuple[SubGroup, int]] = {}  # id(group) -> (sub-group, position in it)
        self.dtypes: dict[str, torch.dtype] = {MASTER: groups[0].master.dtype}
        for sub in self.subgroups:
            for position, index in enumerate(sub.members):
                self.where_is[id(groups[index])] = (sub, position)
        # fp32 is the widest state kept, except fp64 masters (precision "fp64") and their state.
        widest = max(sub.numel for sub in self.subgroups) * max(4, _size(self.dtypes[MASTER]))
        self.pool = BufferPool(config.buffer_count, widest, config.pin_memory, KEY)
        self.writing: list[int] = []  # buffers whose asynchronous writes may still be running
        for sub in self.subgroups:
            sub.regions[MASTER] = self.swap.allocate(sub.numel * _size(self.dtypes[MASTER]))
            for position, index in enumerate(sub.members):
                self.swap.write(groups[index].master.contiguous(), self._piece(sub, MASTER, position))
        for group in groups:
            self._park(group)
            group.master_writer = self.write_master

    # ------------------------------------------------------------------ the step
    def step(self, grads: list[torch.Tensor]) -> None:
        for sub in self.subgroups:
            taken = self._bring_in(sub)
            for index in sub.members:
                self.groups[index].master_param.grad = grads[index]
            # Every rank has the same sub-groups, so a whole-tensor step's collectives match across ranks.
            run_optimizer(self.optimizer, self.shards)
            for index in sub.members:
                group = self.groups[index]
                group.master_param.grad = None
                group.master_to_model()
            self._send_out(sub, taken)
        self._finish_writes()

    def _bring_in(self, sub: SubGroup) -> dict[str, tuple[int, torch.Tensor]]:
        """Read the sub-group's master and known state regions into pool buffers and point at them."""
        taken = {}
        for kind, region in sub.regions.items():
            buffer = self._take()
            flat = self.pool.view(buffer, sub.numel, self.dtypes[kind])
            taken[kind] = (buffer, flat)
            self.swap.read(flat, region)
            for position, index in enumerate(sub.members):
                self._point(self.groups[index], kind, self._slice(sub, flat, position))
        return taken

    def _send_out(self, sub: SubGroup, taken: dict[str, tuple[int, torch.Tensor]]) -> None:
        for kind in self._discover_state(sub):
            # First step: the optimizer made these tensors itself; write them piece by piece as they are.
            sub.regions[kind] = self.swap.allocate(sub.numel * _size(self.dtypes[kind]))
            for position, index in enumerate(sub.members):
                tensor = self._tensor_of(self.groups[index], kind)
                self.swap.write_async(tensor.contiguous(), self._piece(sub, kind, position))
        for kind, (_, flat) in taken.items():
            for position, index in enumerate(sub.members):
                piece = self._slice(sub, flat, position)
                tensor = self._tensor_of(self.groups[index], kind)
                if tensor.data_ptr() != piece.data_ptr():  # an optimizer that replaced its state tensor
                    piece.copy_(tensor)
            self.swap.write_async(flat, sub.regions[kind])
        for index in sub.members:
            self._park(self.groups[index])
        self.writing.extend(buffer for buffer, _ in taken.values())

    @staticmethod
    def _slice(sub: SubGroup, flat: torch.Tensor, position: int) -> torch.Tensor:
        return flat[sub.offsets[position]: sub.offsets[position] + sub.numels[position]]

    def _discover_state(self, sub: SubGroup) -> list[str]:
        """State tensors of the sub-group's size not swapped yet (created by the optimizer's first step)."""
        group = self.groups[sub.members[0]]
        found = []
        for key, value in self.optimizer.state.get(group.master_param, {}).items():
            if (torch.is_tensor(value) and value.numel() == group.shard_numel and key not in sub.regions
                    and key not in self.keep_in_memory):
                found.append(key)
                self.dtypes[key] = value.dtype
        needed = 1 + len({k for k in self.dtypes if k != MASTER})
        if found and self.config.buffer_count < needed:
            raise ZeroConfigError(f"{KEY}.buffer_count = {self.config.buffer_count}, but the optimizer keeps "
                                  f"{needed - 1} state tensor(s) per parameter ({', '.join(found)}) besides the "
                                  f"master weights: set buffer_count to at least {needed} ({2 * needed} lets "
                                  f"writes overlap the next sub-group)")
        return found

    def _take(self) -> int:
        buffer = self.pool.take()
        if buffer is None:  # all in use by writes still running: let them finish
            self._finish_writes()
            buffer = self.pool.take()
        return buffer

    def _finish_writes(self) -> None:
        self.swap.wait()
        for buffer in self.writing:
            self.pool.give_back(buffer)
        self.writing = []

    # ------------------------------------------------------------------ placeholders
    def _point(self, group: Any, kind: str, tensor: torch.Tensor) -> None:
        if kind == MASTER:
            group.master = tensor
            group.master_param.data = tensor
        else:
            self.optimizer.state[group.master_param][kind] = tensor

    def _tensor_of(self, group: Any, kind: str) -> torch.Tensor:
        return group.master if kind == MASTER else self.optimizer.state[group.master_param][kind]

    def _park(self, group: Any) -> None:
        """Between steps the swapped tensors are empty placeholders (their values are in the file)."""
        sub, _ = self.where_is[id(group)]
        for kind in sub.regions:
            self._point(group, kind, torch.empty(0, dtype=self.dtypes[kind]))

    def _piece(self, sub: SubGroup, kind: str, position: int) -> tuple[int, int]:
        size = _size(self.dtypes[kind])
        offset, _ = sub.regions[kind]
        return offset + sub.offsets[position] * size, sub.numels[position] * size

    # ------------------------------------------------------------------ outside the step
    def write_master(self, group: Any, values: torch.Tensor) -> None:
        """New master values for one group (GatheredParameters with modifier_rank)."""
        sub, position = self.where_is[id(group)]
        self.swap.write(values.detach().to(device="cpu", dtype=self.dtypes[MASTER]).contiguous(),
                        self._piece(sub, MASTER, position))

    @contextmanager
    def resident(self, write_back: bool = False) -> Iterator[None]:
        """Every master and state tensor read into fresh memory; written back on exit if asked."""
        self._finish_writes()
        for sub in self.subgroups:
            for kind in sub.regions:
                for position, index in enumerate(sub.members):
                    tensor = torch.empty(sub.numels[position], dtype=self.dtypes[kind])
                    self.swap.read(tensor, self._piece(sub, kind, position))
                    self._point(self.groups[index], kind, tensor)
        try:
            yield
        finally:
            for sub in self.subgroups:
                if write_back:
                    new_kinds = self._discover_state(sub)
                    for kind in new_kinds:
                        sub.regions[kind] = self.swap.allocate(sub.numel * _size(self.dtypes[kind]))
                    for kind in sub.regions:
                        for position, index in enumerate(sub.members):
                            tensor = self._tensor_of(self.groups[index], kind).to(self.dtypes[kind])
                            self.swap.write(tensor.contiguous(), self._piece(sub, kind, position))
                for index in sub.members:
                    self._park(self.groups[index])

    # ------------------------------------------------------------------ accounting
    def state_bytes(self) -> int:
        return sum(region[1] for sub in self.subgroups for kind, region in sub.regions.items() if kind != MASTER)

    def master_bytes(self) -> int:
        return sum(sub.regions[MASTER][1] for sub in self.subgroups)

    def resident_state_bytes(self) -> int:
        """Bytes of the state kept in host memory (keep_in_memory), not in the swap file."""
        return sum(value.numel() * value.element_size() for per_param in self.optimizer.state.values()
                   for key, value in per_param.items() if key in self.keep_in_memory and torch.is_tensor(value))

    def buffer_bytes(self) -> int:
        return self.pool.total_bytes()


def _size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()
