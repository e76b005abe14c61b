"""Optimizers whose update needs whole tensors, on dszero's flat master buffers.

dstrain's Lamb and Muon define `step_on_shards`: dszero's whole-tensor step (dszero.TensorShards)
runs them at every ZeRO stage, with norms summed across shards and each matrix orthogonalised once
by the rank that owns it; they need nothing from here.

Other per-tensor optimizers (torch's Adafactor, LBFGS, a client's own) have no sharded form: they
run on per-tensor views of the flat groups, which needs each rank to hold whole tensors (ZeRO stage
0). `TensorwiseOnFlat` is what dszero sees for them: its groups are flattened like any other, and
its state is flat (one shard-sized tensor per state name), so dszero's checkpoints save it
unchanged; at step time it cuts the flat master, its gradient and the flat state into per-tensor
views, and lets the real optimizer update the views in place.
"""

from __future__ import annotations

from typing import Any

import torch

from dsconfig import ConfigError, Problem
from dszero.whole_tensors import steps_on_shards


def needs_whole_tensors(optimizer: torch.optim.Optimizer) -> bool:
    """Optimizers whose update is not elementwise and that have no whole-tensor step of their own
    (step_on_shards): they run on per-tensor views (marked `needs_whole_tensors`, or known by name)."""
    if steps_on_shards(optimizer):
        return False  # dszero steps it on the shards at any stage
    return bool(getattr(optimizer, "needs_whole_tensors", False)) or type(optimizer).__name__ in (
        "Lamb", "FusedLamb", "Muon", "Adafactor", "LBFGS")


class TensorwiseOnFlat(torch.optim.Optimizer):
    def __init__(self, inner: torch.optim.Optimizer):
        self.inner = inner
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": list(g["params"])}
                  for g in inner.param_groups]
        super().__init__(groups, defaults={})
        self._views: list[list[torch.nn.Parameter]] = []
        self._slots: list[list[tuple[int, int]]] = []

    @staticmethod
    def check_stage(stage: int, optimizer_type: str) -> None:
        if stage != 0:
            raise ConfigError(Problem("zero_optimization.stage", f"{optimizer_type} updates whole tensors and has "
                                                                 f"no sharded step (step_on_shards), but ZeRO stage "
                                                                 f"{stage} splits tensors across ranks; use stage 0, "
                                                                 f"dstrain's Lamb or Muon, or an elementwise optimizer "
                                                                 f"(Adam, AdamW)", stage))

    def bind(self, zero: Any) -> None:
        """After dszero flattened the groups: per-tensor views of each group's flat master."""
        for index in range(len(self.param_groups)):
            originals = [p for p in self.inner.param_groups[index]["params"] if p.requires_grad]
            views, slots, offset = [], [], 0
            for (_name, master_view), original in zip(zero.tensor_views(index), originals, strict=True):
                view = torch.nn.Parameter(master_view, requires_grad=False)
                for attribute in ("use_muon", "muon_num_heads"):  # per-parameter choices a Muon-like optimizer reads
                    if hasattr(original, attribute):
                        setattr(view, attribute, getattr(original, attribute))
                views.append(view)
                slots.append((offset, offset + view.numel()))
                offset += view.numel()
            self.inner.param_groups[index]["params"] = views
            self._views.append(views)
            self._slots.append(slots)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for index, group in enumerate(self.param_groups):
            flat = group["params"][0]
            inner_group = self.inner.param_groups[index]
            inner_group.update({k: v for k, v in group.items() if k != "params"})  # lr etc. from schedulers
            for view, (start, end) in zip(self._views[index], self._slots[index]):
                view.grad = None if flat.grad is None else flat.grad[start:end].view(view.shape)
        self.inner.step()
        for index, group in enumerate(self.param_groups):
            self._collect_state(index, group["params"][0])
            for view in self._views[index]:
                view.grad = None
        return None

    def _collect_state(self, index: int, flat: torch.Tensor) -> None:
        # The first step creates the inner state: move it into flat tensors and leave views behind.
        flat_state = self.state[flat]
        for view, (start, end) in zip(self._views[index], self._slots[index]):
            per_tensor = self.inner.state.get(view, {})
            for key, value in per_tensor.items():
                if torch.is_tensor(value) and value.shape == view.shape and view.dim() > 0:
                    holder = flat_state.get(key)
                    if holder is None:
                        holder = flat_state[key] = torch.zeros(flat.numel(), dtype=value.dtype, device=value.device)
                    target = holder[start:end].view(view.shape)
                    if target.data_ptr() != value.data_ptr():
                        target.copy_(value)
                        per_tensor[key] = target
                else:
                    flat_state[key] = value  # a step count: the same for every tensor of the group

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for index, group in enumerate(self.param_groups):
            flat_state = self.state.get(group["params"][0], {})
            for view, (start, end) in zip(self._views[index], self._slots[index]):
                per_tensor = self.inner.state[view] = {}
                for key, value in flat_state.items():
                    if torch.is_tensor(value) and value.numel() == group["params"][0].numel() and value.ndim == 1:
                        per_tensor[key] = value[start:end].view(view.shape)
                    else:
                        per_tensor[key] = value.clone() if torch.is_tensor(value) else value
