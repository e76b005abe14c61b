"""The whole-tensor step: optimizers whose update needs whole tensors, on ZeRO's flat shards.

Most optimizers are elementwise, so dszero runs them on each rank's flat shard as they are. Lamb
(a trust ratio from each tensor's norms) and Muon (each matrix's update orthogonalised as a
matrix) are not. An optimizer that defines

    def step_on_shards(self, shards: dszero.TensorShards) -> None

is stepped through it instead of `step()`, at every stage: its parameters are still the flat
master shards (so its state is flat and shard-sized, and checkpoints save and reshard it like
Adam's), and `shards` supplies what the flat shards lack:

- `tensors(master)`: the whole tensors of a flat master, each with its name, shape, model
  parameter (and its attributes) and `piece(flat)`: this rank's part of it in any shard-sized tensor;
- `sum_squares(values, ...)`: each whole tensor's sum of squares over every rank's pieces (one
  all-reduce per process group, whatever the number of tensors): Lamb's norms;
- `transform_whole(values, fn)`: each tensor's pieces are gathered to one owner rank, which runs
  `fn(tensor, whole)` once, and every holder gets its piece of the result back: Muon's
  orthogonalisation. Owners are balanced by size (whole_plan.py); only the pieces an owner lacks
  travel, in one all-to-all each way.

At stage 0 every rank holds every tensor whole: nothing travels and every rank computes all
(the same result DDP's ranks compute).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.distributed as dist

import dscomm

from .errors import ZeroError
from .whole_plan import ExchangePlan, held_range


def steps_on_shards(optimizer: Any) -> bool:
    """Whether `optimizer` takes the whole-tensor step (defines step_on_shards)."""
    return callable(getattr(optimizer, "step_on_shards", None))


@attrs.frozen(eq=False)
class WholeTensor:
    """One parameter as a whole, seen from this rank's shard of its flat group.

    master: the flat master parameter it belongs to (the optimizer's parameter); param: the
    model's parameter (its attributes, e.g. use_muon); offset: where it starts in its flat group,
    cut into shards of shard_numel; [lo, hi): the part of the flattened tensor this rank's shard
    holds, starting at `at` in the shard (lo == hi: none of it).
    """

    name: str
    shape: tuple[int, ...]
    param: Any
    master: torch.Tensor
    offset: int
    numel: int
    shard_numel: int
    lo: int
    hi: int
    at: int

    def piece(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's part of the tensor in a shard-sized flat tensor (a view; empty when none)."""
        return flat[self.at:self.at + self.hi - self.lo]


@attrs.frozen(eq=False)
class _Member:
    """A flat group (stages 0-2) or a stage-3 unit, as the whole-tensor step needs it."""

    tensors: tuple[WholeTensor, ...]
    group: Any
    partitioned: bool


class TensorShards:
    """What an optimizer's step_on_shards needs to work on whole tensors: see the module docstring."""

    def __init__(self, groups: Sequence[Any]):
        self._members: dict[int, _Member] = {}
        for flat in groups:
            layout = flat.layout
            lo_shard, _ = layout.shard_range(flat.shard_rank)
            tensors = []
            for slot, param in zip(layout.slots, flat.params):
                lo, hi = held_range(slot.offset, slot.numel, layout.shard_numel, flat.shard_rank)
                at = slot.offset + lo - lo_shard if hi > lo else 0
                tensors.append(WholeTensor(slot.name, slot.shape, param, flat.master_param, slot.offset, slot.numel,
                                           layout.shard_numel, lo, hi, at))
            self._members[id(flat.master_param)] = _Member(tuple(tensors), flat.group, layout.world_size > 1)
        self._routes: dict[tuple[int, ...], list[_Route]] = {}
        self.transformed: list[str] = []  # names of the tensors this rank computed in the last transform_whole

    def tensors(self, master: torch.Tensor) -> tuple[WholeTensor, ...]:
        """The whole tensors of one flat master parameter, in their order in the flat buffer."""
        return self._member(master).tensors

    def _member(self, master: torch.Tensor) -> _Member:
        member = self._members.get(id(master))
        if member is None:
            raise ZeroError(f"a tensor of shape {tuple(master.shape)} is not one of this ZeroOptimizer's flat master "
                            f"parameters; step_on_shards works on the optimizer's own parameters")
        return member

    # ------------------------------------------------------------------ norms
    def sum_squares(self, *values: Mapping[torch.Tensor, torch.Tensor]) -> list[dict[torch.Tensor, torch.Tensor]]:
        """For each mapping (master -> a shard-sized flat tensor), each whole tensor's sum of squares.

        Returns, per mapping, master -> float64 tensor with one entry per whole tensor (in
        tensors(master) order), summed over every rank's pieces: the same on every rank.
        """
        masters = _same_masters(values)
        sums = {(k, id(m)): torch.stack([torch.linalg.vector_norm(t.piece(mapping[m]), dtype=torch.float64).square()
                                         for t in self.tensors(m)])
                for k, mapping in enumerate(values) for m in masters}
        for group, members in _by_group(masters, self._member).items():
            keys = [(k, id(m)) for k in range(len(values)) for m in members]
            partial = torch.cat([sums[key] for key in keys])
            total = partial.to(_comm_device(group, partial.device))
            dscomm.all_reduce(total, group=group, log_name="zero_whole_sum_squares")
            sums.update(zip(keys, total.to(partial.device).split([sums[key].numel() for key in keys])))
        return [{m: sums[(k, id(m))] for m in masters} for k in range(len(values))]

    # ------------------------------------------------------------------ whole-tensor transforms
    def transform_whole(self, values: Mapping[torch.Tensor, torch.Tensor],
                        fn: Callable[[WholeTensor, torch.Tensor], torch.Tensor]) -> dict[torch.Tensor, torch.Tensor]:
        """fn(tensor, whole) once per whole tensor of the given masters, on its owner rank.

        values: master -> shard-sized flat tensor. `whole` is the tensor assembled from every rank's
        piece of `values`, shaped as the parameter; fn returns a tensor of that shape. The result,
        master -> shard-sized flat tensor, holds each rank's pieces of fn's results (zeros in the
        padding). Collective over the masters' process groups: every rank passes the same masters.
        """
        self.transformed = []
        out = {master: torch.zeros_like(flat) for master, flat in values.items()}
        local = [m for m in values if not self._member(m).partitioned]
        for master in local:  # whole on this rank (stage 0, or a group of one rank)
            for tensor in self.tensors(master):
                tensor.piece(out[master]).copy_(self._run(fn, tensor, tensor.piece(values[master])).reshape(-1))
        shared = [m for m in values if self._member(m).partitioned]
        for route in self._routes_for(shared):
            route.run(values, out, lambda tensor, whole: self._run(fn, tensor, whole))
        return out

    def _run(self, fn: Callable[[WholeTensor, torch.Tensor], torch.Tensor], tensor: WholeTensor,
             whole: torch.Tensor) -> torch.Tensor:
        self.transformed.append(tensor.name)
        result = fn(tensor, whole.view(tensor.shape))
        if tuple(result.shape) != tensor.shape:
            raise ZeroError(f"the whole-tensor function returned shape {tuple(result.shape)} for {tensor.name}, "
                            f"whose shape is {tensor.shape}")
        return result

    def plans(self, masters: Sequence[torch.Tensor]) -> list[ExchangePlan]:
        """The owner plans transform_whole would use for these masters, one per process group."""
        return [route.plan for route in self._routes_for(list(masters))]

    def _routes_for(self, masters: list[torch.Tensor]) -> list[_Route]:
        key = tuple(id(m) for m in masters)
        if key not in self._routes:
            self._routes[key] = [_Route(group, [t for m in members for t in self.tensors(m)])
                                 for group, members in _by_group(masters, self._member).items() if members]
        return self._routes[key]


class _Route:
    """The two all-to-alls of one process group's transform: pieces to owners, results back."""

    def __init__(self, group: Any, tensors: list[WholeTensor]):
        self.group = group
        self.tensors = tensors
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        self.plan = ExchangePlan.build([(t.offset, t.numel, t.shard_numel) for t in tensors], world, rank)
        self.sent = [i for d in range(world) for i in self.plan.sent_to(d)]  # in destination order
        self.received = [(s, i) for s in range(world) for i in self.plan.received_from(s)]
        self.send_sizes = self.plan.send_sizes()
        self.receive_sizes = self.plan.receive_sizes()
        self.owned = self.plan.owned()

    def run(self, values: Mapping[torch.Tensor, torch.Tensor], out: dict[torch.Tensor, torch.Tensor],
            compute: Callable[[WholeTensor, torch.Tensor], torch.Tensor]) -> None:
        sample = values[self.tensors[0].master]
        device = _comm_device(self.group, sample.device)
        dtype = sample.dtype
        # Gather: every piece to its tensor's owner.
        outgoing = [self.tensors[i].piece(values[self.tensors[i].master]) for i in self.sent]
        incoming = self._exchange(outgoing, self.send_sizes, self.receive_sizes, device, dtype, "zero_whole_gather")
        wholes = {}
        for i in self.owned:
            tensor = self.tensors[i]
            whole = torch.empty(tensor.numel, dtype=dtype, device=device)
            if tensor.hi > tensor.lo:
                whole[tensor.lo:tensor.hi].copy_(tensor.piece(values[tensor.master]))
            wholes[i] = whole
        position = 0
        for source, i in self.received:
            lo, hi = self.plan.pieces[i][source]
            wholes[i][lo:hi].copy_(incoming[position:position + hi - lo])
            position += hi - lo
        results = {i: compute(self.tensors[i], wholes[i]).reshape(-1).to(dtype) for i in self.owned}
        del wholes
        # Return: each holder's piece of each result.
        back = [results[i][slice(*self.plan.pieces[i][source])] for source, i in self.received]
        returned = self._exchange(back, self.receive_sizes, self.send_sizes, device, dtype, "zero_whole_return")
        for i in self.owned:
            tensor = self.tensors[i]
            if tensor.hi > tensor.lo:
                tensor.piece(out[tensor.master]).copy_(results[i][tensor.lo:tensor.hi])
        position = 0
        for i in self.sent:
            tensor = self.tensors[i]
            size = tensor.hi - tensor.lo
            tensor.piece(out[tensor.master]).copy_(returned[position:position + size])
            position += size

    def _exchange(self, pieces: list[torch.Tensor], send_sizes: list[int], receive_sizes: list[int],
                  device: torch.device, dtype: torch.dtype, log_name: str) -> torch.Tensor:
        send = torch.cat(pieces).to(device) if pieces else torch.empty(0, dtype=dtype, device=device)
        receive = torch.empty(sum(receive_sizes), dtype=dtype, device=device)
        dscomm.all_to_all_single(receive, send, receive_sizes, send_sizes, group=self.group, log_name=log_name)
        return receive


def _same_masters(values: Sequence[Mapping[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    if not values:
        return []
    masters = list(values[0])
    for mapping in values[1:]:
        if [id(m) for m in mapping] != [id(m) for m in masters]:
            raise ZeroError("sum_squares takes mappings over the same masters, in the same order")
    return masters


def _by_group(masters: Sequence[torch.Tensor], member_of: Callable[[torch.Tensor], _Member]
              ) -> dict[Any, list[torch.Tensor]]:
    """Partitioned masters by process group, in first-seen order (the same on every rank)."""
    found: dict[Any, list[torch.Tensor]] = {}
    for master in masters:
        member = member_of(master)
        if member.partitioned:
            found.setdefault(member.group, []).append(master)
    return found


def _comm_device(group: Any, device: torch.device) -> torch.device:
    # NCCL moves device memory only: offloaded (CPU) values travel through the current GPU.
    if device.type == "cpu" and dist.get_backend(group) != "gloo" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device
