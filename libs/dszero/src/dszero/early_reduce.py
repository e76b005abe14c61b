"""Stage 1's reduce-scatter, run during the backward pass that ends the step's accumulation.

Stage 1 keeps every rank's whole gradient in one flat buffer and needs only its own shard of the
reduced sum at the step. Reducing the whole buffer at the step leaves every rank waiting on the
wire between backward and the optimizer (on gloo, 27M fp32 elements: ~76 ms). DDP hides that
behind backward; so does this, without changing what the step applies:

- The flat buffer is cut into buckets of contiguous elements, last parameters first (their
  gradients are ready first), launched strictly in order by `InOrderLauncher` once all their
  gradients are in, as DDP and stage 2 do.
- A launched bucket is *copied* into a staging buffer and reduced from there, one `reduce` per owning
  rank, asynchronously; its owned part goes to the rank's shard as it completes. The flat buffer keeps
  this rank's own gradients, so `.grad`, `safe_get_full_grad` and any later backward see what they
  saw before.
- Only one backward per step launches: the one expected to be the last before the step (the count of
  backward passes in the previous step; 1 at first). If another backward follows it, or gradient sync
  is off, or a gradient was handed over outside autograd's hooks, or a `.grad` no longer views the flat
  buffer at the step, the early result is dropped and the step reduces the buffer as before. The ranks
  agree on that with one one-element all-reduce, so they always issue the same collectives.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .flat import FlatGroup
from .ordered import InOrderLauncher, weakly

# DDP's default bucket (bucket_cap_mb = 25): big enough for gloo's per-op cost not to show, small
# enough that the first buckets leave while most of backward is still to run.
DDP_BUCKET_BYTES = 25 * 2**20


class _Bucket:
    """Elements [lo, hi) of one group's flat buffer, and who owns which part of them."""

    def __init__(self, group_index: int, members: list[int], lo: int, hi: int, group: FlatGroup):
        self.group_index, self.members, self.lo, self.hi = group_index, members, lo, hi
        self.owners = group.layout.owners(lo, hi)  # [(rank, start, end)] in flat positions

    @property
    def numel(self) -> int:
        return self.hi - self.lo


class EarlyShardReduction:
    """Launches stage 1's per-owner reductions from the gradient hooks; `take()` hands over the result."""

    def __init__(self, groups: list[FlatGroup], grad_flats: list[torch.Tensor], shard_outs: list[torch.Tensor],
                 bucket_numel: int, average: bool):
        self.groups, self.grad_flats, self.shard_outs = groups, grad_flats, shard_outs
        self.average = average
        self.buckets: list[_Bucket] = []
        self.where: dict[int, tuple[int, int]] = {}  # id(param) -> (bucket, member index)
        for group_index, group in enumerate(groups):
            self._cut(group_index, group, bucket_numel)
        largest = max(b.numel for b in self.buckets)
        self.staging = [torch.empty(largest, dtype=f.dtype, device=f.device) for f in grad_flats[:1] for _ in range(2)]
        self.launcher = InOrderLauncher([len(b.members) for b in self.buckets], self._launch, lambda: None)
        self.in_flight: list[tuple[_Bucket, torch.Tensor, list[Any]]] = []
        self.turn = 0
        self.sync = True
        self.expected = 1        # backward passes per step, as the last step had them
        self.backwards = 0       # backward passes since the last step
        self.in_backward = False
        self.launched_in = 0     # which backward (1-based) launched the buckets; 0: none yet
        self.launched = 0        # buckets launched by it
        self.spoiled = False     # something changed the gradients outside the hooks
        self.hooks = [param.register_post_accumulate_grad_hook(weakly(self._on_grad))
                      for group in groups for param in group.params]

    def _cut(self, group_index: int, group: FlatGroup, bucket_numel: int) -> None:
        """Buckets tiling the group's flat buffer from its end (padding included), each closed once it
        holds bucket_numel elements."""
        slots = group.layout.slots
        hi, members, size = group.layout.padded_numel, [], 0
        for index in reversed(range(len(slots))):
            members.append(index)
            size += slots[index].numel
            if size >= bucket_numel or index == 0:
                lo = 0 if index == 0 else slots[index].offset
                for member, param_index in enumerate(members):
                    self.where[id(group.params[param_index])] = (len(self.buckets), member)
                self.buckets.append(_Bucket(group_index, members, lo, hi, group))
                hi, members, size = lo, [], 0

    # ------------------------------------------------------------------ during backward
    def _on_grad(self, param: torch.nn.Parameter) -> None:
        if not self.in_backward:
            self.in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
            self.backwards += 1
        # Every rank decides from the same counts, so all launch the same buckets in the same order.
        if self.sync and self.backwards == self.expected and self.launched_in in (0, self.backwards):
            self.launched_in = self.backwards
            bucket, member = self.where[id(param)]
            self.launcher.mark_ready(bucket, member)

    def _backward_ended(self) -> None:
        self.in_backward = False

    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        if len(self.in_flight) == len(self.staging):
            self._complete(self.in_flight.pop(0))  # double buffering: the oldest frees its buffer
        staging = self.staging[self.turn % len(self.staging)][:bucket.numel]
        self.turn += 1
        flat = self.grad_flats[bucket.group_index]
        staging.copy_(flat[bucket.lo:bucket.hi])
        group = self.groups[bucket.group_index]
        world = dist.get_world_size(group.group)
        inside = self.average and (group.average_over or world) == world
        op = dscomm.ReduceOp.AVG if inside else dscomm.ReduceOp.SUM
        handles = []
        for rank, start, end in bucket.owners:
            dst = dist.get_global_rank(group.group, rank) if group.group is not None else rank
            handles.append(dscomm.reduce(staging[start - bucket.lo:end - bucket.lo], dst, op=op, group=group.group,
                                         async_op=True, log_name="zero_reduce_grads_in_backward"))
        self.in_flight.append((bucket, staging, handles))
        self.launched += 1

    def _complete(self, flight: tuple[_Bucket, torch.Tensor, list[Any]]) -> None:
        bucket, staging, handles = flight
        for handle in handles:
            if handle is not None:
                handle.wait()
        group = self.groups[bucket.group_index]
        shard_lo, _ = group.layout.shard_range(group.shard_rank)
        for rank, start, end in bucket.owners:
            if rank == group.shard_rank:
                self.shard_outs[bucket.group_index][start - shard_lo:end - shard_lo].copy_(
                    staging[start - bucket.lo:end - bucket.lo])

    def _drain(self) -> None:
        while self.in_flight:
            self._complete(self.in_flight.pop(0))

    def spoil(self) -> None:
        """Gradients changed outside autograd's hooks (a compiled backward handing them over)."""
        self.spoiled = True

    def set_sync(self, enabled: bool) -> None:
        self.sync = enabled

    # ------------------------------------------------------------------ at the step
    def take(self) -> bool:
        """True when every group's shard_out holds its reduced shard (averaged when the collective could):
        the launching backward was the last, launched every bucket and nothing changed the gradients since.
        Collective (one one-element all-reduce) whenever a backward launched; every rank answers alike."""
        self._drain()
        launched = self.launched_in != 0
        usable = (launched and not self.spoiled and self.launched_in == self.backwards
                  and self.launched == len(self.buckets) and self._grads_are_views())
        if self.backwards:
            self.expected = self.backwards  # the next step is expected to run as many backward passes
        self.launched_in, self.launched, self.backwards, self.spoiled = 0, 0, 0, False
        if not launched:
            return False
        flag = torch.tensor([0.0 if usable else 1.0], device=self.grad_flats[0].device)
        for group in {id(g.group): g.group for g in self.groups}.values():
            if dist.get_world_size(group) > 1:
                dscomm.all_reduce(flag, group=group, log_name="zero_reduce_grads_in_backward_agree")
        return flag.item() == 0.0

    def _grads_are_views(self) -> bool:
        for group, flat in zip(self.groups, self.grad_flats):
            for param, slot in zip(group.params, group.layout.slots):
                if param.grad is None or param.grad.data_ptr() != flat[slot.offset:slot.end].data_ptr():
                    return False
        return True

    def reset(self) -> None:
        """zero_grad: nothing of this step's reductions is kept."""
        self._drain()
        self.launched_in, self.launched, self.backwards, self.spoiled = 0, 0, 0, False

    def buffer_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.staging)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
