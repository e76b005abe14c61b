"""DeepSpeed's optimizer state, parameter by parameter: each parameter's fp32 master and per-element
optimizer state (Adam's exp_avg, exp_avg_sq) whole, from however DeepSpeed cut them.

- Stages 1 and 2 (and the bf16 optimizer without ZeRO): each data rank holds a slice of every group's flat
  buffer; `param_slice_mappings` says which piece of which parameter the slice holds (start, numel), so
  a parameter is the concatenation of its pieces in rank order.
- Stage 3: each parameter is cut on its own into `ceil(numel / ranks)` elements per rank, and a rank's flat
  buffer of a sub-group is its pieces of the sub-group's parameters in order (`param_shapes`).
- No ZeRO: torch's optimizer state dict, by parameter index, in the model file.

Every function returns ({name: {"master": fp32 tensor, <state key>: tensor}}, scalars such as "step") and
raises CheckpointLoadError naming the file and parameter when pieces are missing or do not add up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointLoadError
from ..contents import MASTER

States = dict[str, dict[str, torch.Tensor]]


def _field(state: Any, key: str, path: Path) -> Any:
    if not isinstance(state, dict) or key not in state:
        raise CheckpointLoadError(f"{path}: '{key}' is missing; not a DeepSpeed optimizer file of this kind")
    return state[key]


def _flat_states(group_state: Any, numel: int, path: Path, group: int) -> tuple[dict[str, torch.Tensor], dict]:
    """A group's per-element states (tensors the size of the flat buffer) and its scalars (the step)."""
    if not isinstance(group_state, dict):
        raise CheckpointLoadError(f"{path}: the optimizer state of group {group} is a {type(group_state).__name__}")
    flat, scalars = {}, {}
    for key, value in group_state.items():
        if torch.is_tensor(value) and value.dim() >= 1 and value.numel() == numel:
            flat[str(key)] = value.reshape(-1)
        elif torch.is_tensor(value) and value.numel() == 1:
            scalars[str(key)] = value.item()
        elif isinstance(value, int | float | bool):
            scalars[str(key)] = value
        elif torch.is_tensor(value):
            raise CheckpointLoadError(f"{path}: optimizer state '{key}' of group {group} has {value.numel()} elements, "
                                      f"its flat buffer {numel}: truncated or not this group's")
    return flat, scalars


def _step_scalars(scalars: dict[str, Any]) -> dict[str, Any]:
    out = dict(scalars)
    if "step" in out:
        out["step"] = round(float(out["step"]))
    return out


def _shape_of(param_shapes: Sequence[dict], name: str, path: Path) -> tuple[int, ...]:
    for shapes in param_shapes:
        if name in shapes:
            return tuple(int(d) for d in shapes[name])
    raise CheckpointLoadError(f"{path}: parameter {name} is in the optimizer files but not in param_shapes of the "
                              f"model-states file")


def sliced_states(optim: Sequence[tuple[Path, dict]], param_shapes: Sequence[dict],
                  rename: Callable[[int, int, str], str] | None = None) -> tuple[States, dict[str, Any]]:
    """Stages 1-2: (file, optimizer_state_dict) of every data rank in rank order -> whole per-parameter states.
    `rename(rank, group, name)`: the parameter's name in the whole model (MoE experts are numbered per rank
    in DeepSpeed's files); the shape is looked up under the file's own name."""
    first_path, first = optim[0]
    groups = len(_field(first, "single_partition_of_fp32_groups", first_path))
    pieces: dict[str, list[tuple[str, torch.Tensor]]] = {}  # whole name -> [(kind, piece)] in rank order
    local_names: dict[str, str] = {}
    scalars: dict[str, Any] = {}
    for rank, (path, state) in enumerate(optim):
        masters = _field(state, "single_partition_of_fp32_groups", path)
        mappings = _field(state, "param_slice_mappings", path)
        base = _field(_field(state, "base_optimizer_state", path), "state", path)
        if len(masters) != groups or len(mappings) != groups:
            raise CheckpointLoadError(f"{path}: {len(masters)} parameter groups, {first_path} has {groups}")
        for g in range(groups):
            flat_master = masters[g].reshape(-1)
            flat, group_scalars = _flat_states(base.get(g, {}), flat_master.numel(), path, g)
            scalars = scalars or _step_scalars(group_scalars)
            for local, address in mappings[g].items():
                start, numel = _address(address, path, local)
                if start < 0 or start + numel > flat_master.numel():
                    raise CheckpointLoadError(f"{path}: the piece of {local} at {start}+{numel} lies outside the "
                                              f"rank's {flat_master.numel()} elements (truncated or corrupt)")
                name = rename(rank, g, local) if rename is not None else local
                local_names.setdefault(name, local)
                entry = pieces.setdefault(name, [])
                entry.append((MASTER, flat_master[start:start + numel]))
                for kind, values in flat.items():
                    entry.append((kind, values[start:start + numel]))
    states: States = {}
    for name, entries in pieces.items():
        shape = _shape_of(param_shapes, local_names[name], first_path)
        kinds: dict[str, list[torch.Tensor]] = {}
        for kind, piece in entries:
            kinds.setdefault(kind, []).append(piece)
        states[name] = {kind: _whole(parts, shape, name, kind, first_path.parent) for kind, parts in kinds.items()}
    _check_all_present(set(local_names.values()), param_shapes, first_path)
    return states, scalars


def _address(address: Any, path: Path, name: str) -> tuple[int, int]:
    if isinstance(address, dict) and "start" in address and "numel" in address:
        return int(address["start"]), int(address["numel"])
    if isinstance(address, tuple | list) and len(address) == 2:  # fragment_address is (numel, start)
        return int(address[1]), int(address[0])
    raise CheckpointLoadError(f"{path}: the slice mapping of {name} is a {type(address).__name__}, not DeepSpeed's "
                              f"fragment_address")


def _whole(parts: list[torch.Tensor], shape: tuple[int, ...], name: str, kind: str, where: Path) -> torch.Tensor:
    """The parameter's pieces joined (one piece stays a view of its file's mapped tensor: nothing is read
    until the piece is used)."""
    numel = sum(p.numel() for p in parts)
    if numel != math.prod(shape):
        raise CheckpointLoadError(f"{where}: parameter {name} ({kind}) has {numel} elements over the ranks' "
                                  f"files but its shape {shape} needs {math.prod(shape)}: a rank's file is missing, "
                                  f"truncated or from another checkpoint")
    flat = torch.cat(parts) if len(parts) > 1 else parts[0]
    return flat.reshape(shape).float() if kind == MASTER else flat.reshape(shape)


def _check_all_present(found: set[str], param_shapes: Sequence[dict], path: Path) -> None:
    for shapes in param_shapes:
        missing = [name for name in shapes if name not in found]
        if missing:
            raise CheckpointLoadError(f"{path.parent}: no optimizer file holds parameter(s) {missing[:5]} that "
                                      f"param_shapes lists")


def stage3_states(optim: Sequence[tuple[Path, dict]], param_shapes: Sequence[dict]) -> tuple[States, dict[str, Any]]:
    """Stage 3: (file, optimizer_state_dict) of every data rank in rank order -> whole per-parameter states."""
    ranks = len(optim)
    first_path, first = optim[0]
    groups = len(_field(first, "fp32_flat_groups", first_path))
    if groups != len(param_shapes):
        raise CheckpointLoadError(f"{first_path}: {groups} flat groups but param_shapes lists {len(param_shapes)} "
                                  f"sub-groups")
    per_rank: list[list[dict[str, torch.Tensor]]] = []  # rank -> group -> {kind: flat}
    scalars: dict[str, Any] = {}
    for path, state in optim:
        masters = _field(state, "fp32_flat_groups", path)
        base = _field(_field(state, "optimizer_state_dict", path), "state", path)
        if len(masters) != groups:
            raise CheckpointLoadError(f"{path}: {len(masters)} flat groups, {first_path} has {groups}")
        rank_groups = []
        for g in range(groups):
            flat_master = masters[g].reshape(-1)
            flat, group_scalars = _flat_states(base.get(g, {}), flat_master.numel(), path, g)
            scalars = scalars or _step_scalars(group_scalars)
            rank_groups.append({MASTER: flat_master, **flat})
        per_rank.append(rank_groups)
    states: States = {}
    for g, shapes in enumerate(param_shapes):
        kinds = set.intersection(*(set(per_rank[r][g]) for r in range(ranks)))
        offset = 0
        for name, raw_shape in shapes.items():
            shape = tuple(int(d) for d in raw_shape)
            part = math.ceil(math.prod(shape) / ranks)
            entry = states.setdefault(name, {})
            for kind in kinds:
                pieces = []
                for r in range(ranks):
                    flat = per_rank[r][g][kind]
                    if offset + part > flat.numel():
                        raise CheckpointLoadError(f"{optim[r][0]}: parameter {name} ({kind}) needs elements "
                                                  f"{offset}..{offset + part} of sub-group {g}, which has "
                                                  f"{flat.numel()}: truncated, or param_shapes is not this run's")
                    pieces.append(flat[offset:offset + part])
                joined = torch.cat(pieces) if ranks > 1 else pieces[0]
                entry[kind] = joined[:math.prod(shape)].reshape(shape)
                if kind == MASTER:
                    entry[kind] = entry[kind].float()
            offset += part
        leftover = per_rank[0][g][MASTER].numel() - offset
        if leftover:
            raise CheckpointLoadError(f"{first_path}: sub-group {g} holds {leftover} more elements than its parameters "
                                      f"in param_shapes need: the model-states file is not this checkpoint's")
    return states, scalars


def unpartitioned_states(optimizer_state: Any, names: Sequence[str], shapes: dict[str, tuple[int, ...]],
                         path: Path) -> tuple[States, dict[str, Any]]:
    """No ZeRO: torch's optimizer state dict, whose parameters are numbered in the order of `names`."""
    groups = _field(optimizer_state, "param_groups", path)
    per_param = _field(optimizer_state, "state", path)
    indices = [int(i) for group in groups for i in group.get("params", [])]
    if len(indices) != len(names):
        raise CheckpointLoadError(f"{path}: the optimizer has {len(indices)} parameters, the saved module "
                                  f"{len(names)} trained ones; cannot tell which is which")
    states: States = {}
    scalars: dict[str, Any] = {}
    for index, name in zip(indices, names):
        entry = per_param.get(index, {})
        values, group_scalars = _flat_states(entry, math.prod(shapes[name]), path, index)
        scalars = scalars or _step_scalars(group_scalars)
        states[name] = {kind: value.reshape(shapes[name]) for kind, value in values.items()}
    return states, scalars
