"""The experts this rank holds, named by their global expert id.

DeepSpeed keeps a rank's experts in a ModuleList, so their parameter names say 0..n-1 on every rank
and the same name means a different expert on each expert-parallel rank. Here the experts are named
by global id (`deepspeed_experts.5.fc1.weight` is expert 5 wherever it lives), so checkpoints find
each expert by name and load at any expert-parallel size. The ids are 0..n-1 until the layer learns
its place in the expert-parallel group (`renumber`), which happens before an optimizer reads names.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator

import torch
from torch import nn


def mark_expert_parameters(module: nn.Module, group_name: str) -> None:
    """DeepSpeed's marks on expert parameters: not all-reduced over the data-parallel group, but over
    the expert-data-parallel group of the expert group `group_name`."""
    for param in module.parameters():
        param.allreduce = False
        param.group_name = group_name


class ExpertList(nn.Module):
    """Local experts in order, each registered under its global id; indexable by local position."""

    def __init__(self, experts: list[nn.Module], first_id: int = 0):
        super().__init__()
        for offset, expert in enumerate(experts):
            self.add_module(str(first_id + offset), expert)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def __getitem__(self, local_index: int) -> nn.Module:
        return list(self._modules.values())[local_index]  # type: ignore[return-value]

    def global_ids(self) -> list[int]:
        return [int(name) for name in self._modules]

    def renumber(self, first_id: int) -> None:
        """Register the experts as global ids first_id, first_id + 1, ... (same modules, new names)."""
        self._modules = OrderedDict((str(first_id + i), module) for i, module in enumerate(self._modules.values()))


class Experts(nn.Module):
    """`num_local_experts` copies of `expert` (DeepSpeed's Experts): forward takes [..., local experts,
    tokens, model] and runs chunk i through local expert i."""

    def __init__(self, expert: nn.Module, num_local_experts: int = 1, expert_group_name: str | None = None):
        super().__init__()
        self.deepspeed_experts = ExpertList([copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for local in self.deepspeed_experts:
            mark_expert_parameters(local, expert_group_name or "")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        chunks = inputs.chunk(self.num_local_experts, dim=1)
        return torch.cat([_first(expert(chunk)) for chunk, expert in zip(chunks, self.deepspeed_experts)], dim=1)

    def forward_rows(self, rows: list[torch.Tensor]) -> list[torch.Tensor]:
        """Local expert i on rows[i] ([tokens, model]; any number of tokens). Every expert runs, even on no
        rows: whatever hooks an expert's forward sees each expert every step on every rank (ZeRO stage 3
        gathers its weights there, a collective over the ranks holding it)."""
        return [_first(expert(part)) for part, expert in zip(rows, self.deepspeed_experts)]


def _first(output):
    # An expert may return (output, bias) as Megatron's MLPs do; DeepSpeed keeps the output.
    return output[0] if isinstance(output, tuple) else output
