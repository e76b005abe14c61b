"""How gradients reach their owners, by stage.

- stage 0: gradients accumulate whole in a flat buffer; all-reduced at the optimizer step.
- stage 1: the same buffer, reduce-scattered at the step: each rank keeps only its shard.
- stage 2: gradients are reduced during backward in fixed buckets of `reduce_bucket_size`
  elements, each piece to the rank that owns it, and accumulated into that rank's shard; no rank
  keeps more than its shard plus the buckets in flight. Buckets are launched strictly in order
  (as DDP does), so every rank issues the same collectives even when gradients arrive in a
  different order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import dscomm

from .flat import FlatGroup
from .layout import Slot
from .ordered import InOrderLauncher, weakly
from .wire import reduce_scatter, whole_slot


class FlatReducer:
    """Stages 0 and 1: gradients accumulate in one flat buffer per group.

    In the model's dtype, `.grad` of every parameter is a view of that buffer. In another
    accumulation dtype (data_types.grad_accum_dtype, e.g. fp32 for a bf16 model), each backward's
    `.grad` is added into the buffer as soon as autograd has it and then dropped, as DeepSpeed's bf16
    optimizer does. The buffers are reduced only at the step (in `comm_dtype`, default their own
    dtype), so the gradient-sync controls have nothing to hold back here.
    """

    holds_gradients_back = True  # nothing is communicated before the step

    def __init__(self, groups: list[FlatGroup], partition: bool, average: bool, comm_dtype: torch.dtype | None = None,
                 accum_dtype: torch.dtype | None = None):
        self.groups = groups
        self.comm_dtype = comm_dtype
        self.partition = partition
        self.average = average
        self.grad_flats = []
        self.hooks = []
        self.fold_into: dict[int, torch.Tensor] = {}  # id(param) -> its slice of an accumulation buffer
        for group in groups:
            folding = accum_dtype not in (None, group.dtype)
            flat = torch.zeros_like(group.model_flat, dtype=accum_dtype if folding else group.dtype)
            for param, slot in zip(group.params, group.layout.slots):
                if folding:
                    self.fold_into[id(param)] = flat[slot.offset:slot.end]
                    self.hooks.append(param.register_post_accumulate_grad_hook(weakly(self._fold)))
                else:
                    param.grad = flat[slot.offset:slot.end].view(slot.shape)
            self.grad_flats.append(flat)
        # reduce-scatter's output must not alias its input: one shard-sized buffer per group.
        self.shard_outs = [torch.zeros(g.shard_numel, dtype=f.dtype, device=g.model_flat.device)
                           for g, f in zip(groups, self.grad_flats)] if partition else []

    def _fold(self, param: torch.nn.Parameter) -> None:
        self.fold_into[id(param)].add_(param.grad.reshape(-1))  # cast into the accumulation dtype
        param.grad = None

    def accept_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        """A gradient a compiled backward hands over instead of returning it: accumulated as autograd
        would have (read now; its memory may be reused once this returns)."""
        fold = self.fold_into.get(id(param))
        if fold is not None:
            fold.add_(grad.reshape(-1))
        elif param.grad is None:
            param.grad = grad.detach().clone()
        else:
            param.grad.add_(grad)

    def set_sync(self, enabled: bool) -> None:
        pass  # nothing is communicated before the step anyway

    def finish_backward(self) -> None:
        pass

    def reduce(self) -> list[torch.Tensor]:
        """This rank's reduced gradient shard of each group (in its accumulation dtype)."""
        shards = []
        for group, flat in zip(self.groups, self.grad_flats):
            self._reattach(group, flat)
            world = dist.get_world_size(group.group)
            divisor = (group.average_over or world) if self.average else 1
            # Averaging inside the collective saves a pass over the gradients (when it divides by the group).
            inside = divisor == world and world > 1
            op = dscomm.ReduceOp.AVG if inside else dscomm.ReduceOp.SUM
            # communication_data_type: reduce a cast copy, then bring the result back to the gradients' dtype.
            wire = flat if self.comm_dtype in (None, flat.dtype) else flat.to(self.comm_dtype)
            if self.partition:
                out = self.shard_outs[len(shards)]
                wire_out = out if wire is flat else torch.empty(out.numel(), dtype=wire.dtype, device=out.device)
                # The flat gradients are overwritten (the next micro-step starts from zero_grad anyway).
                reduce_scatter(wire_out, wire, group.group, average=inside, log_name="zero_reduce_scatter_grads")
                if wire_out is not out:
                    out.copy_(wire_out)
                result = out
            else:
                if world > 1:
                    dscomm.all_reduce(wire, op=op, group=group.group, log_name="zero_allreduce_grads")
                if wire is not flat:
                    flat.copy_(wire)
                result = flat
            if divisor != 1 and not inside:
                result.div_(divisor)
            shards.append(result)
        return shards

    def _reattach(self, group: FlatGroup, flat: torch.Tensor) -> None:
        # A user's zero_grad(set_to_none=True) or an optimizer may have replaced .grad: fold it back.
        folding = flat.dtype != group.dtype
        for param, slot in zip(group.params, group.layout.slots):
            view = flat[slot.offset:slot.end].view(slot.shape)
            if folding:
                if param.grad is not None:  # set by hand, outside a backward pass
                    view.add_(param.grad)
                    param.grad = None
                continue
            if param.grad is None:
                view.zero_()
            elif param.grad.data_ptr() != view.data_ptr():
                view.copy_(param.grad)
            param.grad = view

    def zero(self) -> None:
        for group, flat in zip(self.groups, self.grad_flats):
            if flat.dtype != group.dtype:
                for param in group.params:
                    param.grad = None
            flat.zero_()
            self._reattach(group, flat)

    def grad_shard(self, index: int) -> torch.Tensor | None:
        """None: the gradients are reduced only at the step, so no rank holds its reduced shard before it."""
        return None

    def set_reduced(self, index: int, param: torch.nn.Parameter, slot: Slot, value: torch.Tensor) -> None:
        """Make the step's reduction of one parameter give `value` (flat, loss-scaled), given that every rank of
        its group sets the same: each rank's own buffer holds its share of the sum the reduction takes."""
        group, flat = self.groups[index], self.grad_flats[index]
        world = dist.get_world_size(group.group)
        divisor = (group.average_over or world) if self.average else 1
        view = flat[slot.offset:slot.end]
        view.copy_(value * (divisor / world))
        # What _reattach would otherwise fold in or copy over it at the step: a hand-set or folded-away .grad.
        param.grad = None if flat.dtype != group.dtype else view.view(slot.shape)

    def full_grad(self, index: int, slot: Slot, unscale: float) -> torch.Tensor:
        """One parameter's gradient as the step will apply it (reduced, averaged, unscaled), in fp32;
        collective over its group (the buffers are reduced only at the step, so a copy is reduced here)."""
        group = self.groups[index]
        local = self.grad_flats[index][slot.offset:slot.end].float().clone()
        world = dist.get_world_size(group.group)
        if world > 1:
            dist.all_reduce(local, group=group.group)
        divisor = (group.average_over or world) if self.average else 1
        return (local / (divisor * unscale)).view(slot.shape)

    def unused_parameters(self) -> list[str]:
        return []  # not tracked: an unused parameter's gradient is its buffer's zeros, reduced like the rest

    def settings(self) -> dict[str, int]:
        return {}

    def buffer_bytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.grad_flats)

    def comm_buffer_bytes(self) -> int:
        return sum(o.numel() * o.element_size() for o in self.shard_outs)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


class _Bucket:
    """Fixed set of parameters, reduced together; its staging is grouped by owning rank."""

    def __init__(self, group_index: int, params: list[int], group: FlatGroup):
        self.group_index = group_index
        self.params = params
        layout = group.layout
        by_rank: dict[int, list[tuple[int, int, int, int]]] = {}
        for index in params:
            slot = layout.slots[index]
            for rank, start, end in layout.owners(slot.offset, slot.end):
                by_rank.setdefault(rank, []).append((index, start - slot.offset, end - slot.offset, start))
        # (rank, [(param index, start in param, end in param, flat position)], segment start, segment end)
        self.segments = []
        cursor = 0
        for rank in sorted(by_rank):
            pieces = by_rank[rank]
            size = sum(end - start for _, start, end, _ in pieces)
            self.segments.append((rank, pieces, cursor, cursor + size))
            cursor += size
        self.numel = cursor


class BucketReducer:
    """Stage 2: gradients reduced in buckets during backward, kept only as this rank's shard.

    With gradient sync off, backward passes leave their gradients in `.grad` (accumulating) and
    launch nothing; the next synced backward, or `finish_backward()`, reduces everything.
    """

    holds_gradients_back = True

    def __init__(self, groups: list[FlatGroup], bucket_numel: int, overlap: bool, average: bool,
                 grad_dtype: torch.dtype, wire_dtype: torch.dtype | None = None):
        """grad_dtype: what this rank's shard accumulates in (data_types.grad_accum_dtype); wire_dtype: what
        each bucket is reduced in (communication_data_type; None: the model's dtype, as DeepSpeed's default)."""
        self.groups = groups
        self.average = average
        self.overlap = overlap
        self.sync = True
        self.pending_local = False  # gradients accumulated with sync off, not reduced yet
        self.got_grad: set[int] = set()  # id(param) of those that had a gradient since zero() (unused parameters)
        self.bucket_numel = bucket_numel
        self.grad_shards = [torch.zeros(g.shard_numel, dtype=grad_dtype, device=g.model_flat.device) for g in groups]
        self.buckets: list[_Bucket] = []
        self.where: dict[int, tuple[int, int]] = {}  # id(param) -> (bucket, index in group)
        for group_index, group in enumerate(groups):
            pending: list[int] = []
            size = 0
            # Reverse order: the last layers' gradients are ready first.
            for index in reversed(range(len(group.params))):
                pending.append(index)
                size += group.layout.slots[index].numel
                if size >= bucket_numel:
                    self._add_bucket(group_index, pending, group)
                    pending, size = [], 0
            if pending:
                self._add_bucket(group_index, pending, group)
        largest = max((b.numel for b in self.buckets), default=0)
        self.wire_dtype = wire_dtype or (groups[0].dtype if groups else torch.float32)
        device = groups[0].model_flat.device if groups else torch.device("cpu")
        # The staging buffers are what goes over the wire; each piece is cast into them as it is copied.
        self.staging = [torch.zeros(largest, dtype=self.wire_dtype, device=device)
                        for _ in range(2 if overlap else 1)]
        self.turn = 0
        self.in_flight: list[tuple[_Bucket, torch.Tensor, list[Any]]] = []
        self.launcher = InOrderLauncher([len(b.params) for b in self.buckets],
                                        lambda i: self._launch(self.buckets[i]), self._end_of_backward)
        self.hooks = []
        for group in groups:
            for param in group.params:
                self.hooks.append(param.register_post_accumulate_grad_hook(weakly(self._on_grad)))

    def _add_bucket(self, group_index: int, params: list[int], group: FlatGroup) -> None:
        bucket = _Bucket(group_index, list(params), group)
        for index in params:
            self.where[id(group.params[index])] = (len(self.buckets), index)
        self.buckets.append(bucket)

    # ------------------------------------------------------------------ during backward
    def accept_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        """A gradient a compiled backward hands over instead of returning it: accumulated into `.grad` and
        bucketed as autograd's would be (read now or copied: its memory may be reused once this returns)."""
        bucket_index, _ = self.where[id(param)]
        if param.grad is not None:
            param.grad.add_(grad)
        else:
            param.grad = grad.detach()
        if self.sync and bucket_index < self.launcher.next:  # its bucket was reduced already (two graphs use it)
            self._launch(self.buckets[bucket_index])
            return
        self._on_grad(param)
        if param.grad is not None and param.grad.data_ptr() == grad.data_ptr():  # its bucket waits: keep a copy
            param.grad = grad.detach().clone()

    def _on_grad(self, param: torch.nn.Parameter) -> None:
        self.got_grad.add(id(param))
        if not self.sync:
            self.pending_local = True
            return
        bucket_index, index = self.where[id(param)]
        self.launcher.mark_ready(bucket_index, index)

    def _end_of_backward(self) -> None:
        self.pending_local = False  # every bucket was launched, accumulated gradients included
        self.finish()

    def set_sync(self, enabled: bool) -> None:
        self.sync = enabled

    def finish_backward(self) -> None:
        """Reduce what sync-off backward passes accumulated (every bucket, in order), then wait for all."""
        if self.pending_local:
            for bucket in self.buckets:
                self._launch(bucket)
            self.pending_local = False
        self.finish()

    def _launch(self, bucket: _Bucket) -> None:
        group = self.groups[bucket.group_index]
        if len(self.in_flight) >= len(self.staging):
            self._complete(self.in_flight.pop(0))  # double buffering: the oldest bucket frees its buffer
        staging = self.staging[self.turn % len(self.staging)][: bucket.numel]
        self.turn += 1
        world = dist.get_world_size(group.group)
        divisor = (group.average_over or world) if self.average else 1
        # Divided as it is copied where no cast comes between (the same roundings, one pass fewer).
        divide_late = divisor != 1 and any(group.params[i].grad is not None and group.params[i].grad.dtype !=
                                           staging.dtype for i in bucket.params)
        for _rank, pieces, seg_lo, _seg_hi in bucket.segments:
            cursor = seg_lo
            for index, start, end, _ in pieces:
                param = group.params[index]
                piece = staging[cursor:cursor + end - start]
                if param.grad is None:
                    piece.zero_()
                elif divisor == 1 or divide_late:
                    piece.copy_(param.grad.reshape(-1)[start:end])
                else:
                    torch.div(param.grad.reshape(-1)[start:end], divisor, out=piece)
                cursor += end - start
        for index in bucket.params:
            group.params[index].grad = None  # the full gradient is no longer needed here
        if divide_late:
            staging.div_(divisor)
        handles = []
        for rank, _pieces, seg_lo, seg_hi in bucket.segments:
            if world == 1:
                continue
            dst = dist.get_global_rank(group.group, rank) if group.group is not None else rank
            handles.append(dscomm.reduce(staging[seg_lo:seg_hi], dst, group=group.group,
                                         async_op=self.overlap, log_name="zero_reduce_bucket"))
        self.in_flight.append((bucket, staging, handles))
        if not self.overlap:
            self._complete(self.in_flight.pop(0))

    def _complete(self, flight: tuple[_Bucket, torch.Tensor, list[Any]]) -> None:
        bucket, staging, handles = flight
        for handle in handles:
            if handle is not None:
                handle.wait()
        shard = self.grad_shards[bucket.group_index]
        group = self.groups[bucket.group_index]
        lo, _ = group.layout.shard_range(group.shard_rank)
        for rank, pieces, seg_lo, _ in bucket.segments:
            if rank != group.shard_rank:
                continue
            cursor = seg_lo
            for _index, start, end, flat_pos in pieces:
                size = end - start
                shard[flat_pos - lo: flat_pos - lo + size].add_(staging[cursor:cursor + size])  # to grad_dtype
                cursor += size

    def finish(self) -> None:
        while self.in_flight:
            self._complete(self.in_flight.pop(0))

    # ------------------------------------------------------------------ at the step
    def reduce(self) -> list[torch.Tensor]:
        self.finish_backward()
        return self.grad_shards

    def grad_shard(self, index: int) -> torch.Tensor:
        """This rank's reduced (averaged, still loss-scaled) gradient shard of group `index`, after
        finish_backward(); writing into it changes what the step applies."""
        return self.grad_shards[index]

    def full_grad(self, index: int, slot: Slot, unscale: float) -> torch.Tensor:
        """One parameter's reduced gradient, gathered from the shards and unscaled, in fp32 (collective)."""
        group = self.groups[index]
        return whole_slot(self.grad_shards[index].float(), group.layout, slot, group.group) / unscale

    def unused_parameters(self) -> list[str]:
        """Names of the parameters that had no gradient since the last zero()."""
        return [name for group in self.groups for param, name in zip(group.params, group.names)
                if id(param) not in self.got_grad]

    def zero(self) -> None:
        self.pending_local = False
        self.got_grad.clear()
        for shard in self.grad_shards:
            shard.zero_()
        for group in self.groups:
            for param in group.params:
                param.grad = None

    def settings(self) -> dict[str, int]:
        return {"reduce_bucket_size": self.bucket_numel}

    def buffer_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.grad_shards)

    def comm_buffer_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.staging)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
