"""Collectives built from others, for backends that lack an op, a reduce op or a dtype.

Each emulation gives the same result as the native op. The native op is tried first; a
"not supported" refusal is remembered per (backend, op, dtype) so the emulation is used from then
on, and the path taken is logged at debug level. `forced()` lets tests run an emulation on a
backend that has the native op, to check it gives the same result.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

import torch
import torch.distributed as dist

from .errors import CommError

log = logging.getLogger("dscomm")

_UNSUPPORTED = re.compile(r"not supported|unsupported|does not support|not implemented|no support|"
                          r"invalid scalar type|unsupported datatype", re.IGNORECASE)
_known_missing: set[tuple[str, str, str]] = set()
_forced: set[str] = set()


def is_unsupported_error(exc: BaseException) -> bool:
    return isinstance(exc, (RuntimeError, NotImplementedError, ValueError)) and bool(_UNSUPPORTED.search(str(exc)))


def any_emulated() -> bool:
    """False on the common path (nothing refused, nothing forced): no per-call lookups needed."""
    return bool(_known_missing or _forced)


def should_emulate(backend: str, op: str, dtype: torch.dtype) -> bool:
    return op in _forced or (backend, op, str(dtype)) in _known_missing


def remember_missing(backend: str, op: str, dtype: torch.dtype, exc: BaseException) -> None:
    _known_missing.add((backend, op, str(dtype)))
    log.debug("dscomm: backend %s refused %s for %s (%s); using the emulated path from now on",
              backend, op, dtype, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


@contextlib.contextmanager
def forced(*ops: str) -> Iterator[None]:
    """Use the emulation of `ops` even where the backend has them (tests, debugging)."""
    _forced.update(ops)
    try:
        yield
    finally:
        _forced.difference_update(ops)


def _group_size(group) -> int:
    return dist.get_world_size(group)


def _group_rank(group) -> int:
    return dist.get_rank(group)


def all_reduce(tensor: torch.Tensor, op, group) -> None:
    """SUM on an upcast copy, or SUM then divide for AVG."""
    if op == dist.ReduceOp.AVG:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise CommError(f"all_reduce with ReduceOp.AVG needs a floating-point tensor, not {tensor.dtype}; "
                            f"use ReduceOp.SUM and divide")
        work = tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()
        dist.all_reduce(work, op=dist.ReduceOp.SUM, group=group)
        work.div_(_group_size(group))
    else:
        work = tensor.float() if tensor.is_floating_point() and tensor.dtype != torch.float64 else tensor.clone()
        dist.all_reduce(work, op=op, group=group)
    if work is not tensor:
        tensor.copy_(work)


def reduce(tensor: torch.Tensor, dst: int, op, group) -> None:
    """all_reduce, kept only on the destination."""
    result = tensor.clone()
    all_reduce(result, op, group)
    if dist.get_rank() == dst:
        tensor.copy_(result)


def all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor, group) -> None:
    """Each rank writes its part into zeros; a SUM all_reduce fills in the rest exactly."""
    n, me = _group_size(group), _group_rank(group)
    if output.numel() != tensor.numel() * n:
        raise CommError(f"all_gather_into_tensor: output has {output.numel()} elements, expected "
                        f"{tensor.numel()} x {n} ranks")
    buffer = torch.zeros(output.numel(), dtype=_wide(tensor.dtype), device=tensor.device)
    buffer.view(n, -1)[me].copy_(tensor.reshape(-1))
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
    output.copy_(buffer.view(output.shape))


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group) -> None:
    flat = torch.empty(tensor.numel() * len(tensor_list), dtype=tensor.dtype, device=tensor.device)
    all_gather_into_tensor(flat, tensor, group)
    for out, part in zip(tensor_list, flat.view(len(tensor_list), -1)):
        out.copy_(part.view(out.shape))


def reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor, op, group) -> None:
    """all_reduce of a copy, keeping this rank's slice."""
    n, me = _group_size(group), _group_rank(group)
    if tensor.numel() != output.numel() * n:
        raise CommError(f"reduce_scatter_tensor: input has {tensor.numel()} elements, expected "
                        f"{output.numel()} x {n} ranks")
    work = tensor.clone()
    all_reduce(work, op, group)
    output.copy_(work.reshape(n, -1)[me].view(output.shape))


def all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, output_split_sizes, input_split_sizes,
                      group) -> None:
    """Point-to-point exchange of each rank's chunk (dim 0 splits, equal when not given)."""
    n, me = _group_size(group), _group_rank(group)
    in_chunks = _split(tensor, input_split_sizes, n, "input")
    out_chunks = _split(output, output_split_sizes, n, "output")
    ops = []
    for peer in range(n):
        if peer == me:
            out_chunks[me].copy_(in_chunks[me])
            continue
        global_peer = dist.get_global_rank(group, peer) if group is not None else peer
        ops.append(dist.P2POp(dist.isend, in_chunks[peer].contiguous(), global_peer, group))
        ops.append(dist.P2POp(dist.irecv, out_chunks[peer], global_peer, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _split(tensor: torch.Tensor, sizes, n: int, what: str) -> list[torch.Tensor]:
    if sizes is None or len(sizes) == 0:
        if tensor.shape[0] % n:
            raise CommError(f"all_to_all_single: {what} dim 0 ({tensor.shape[0]}) does not divide into {n} ranks")
        return list(tensor.chunk(n))
    if len(sizes) != n or sum(sizes) != tensor.shape[0]:
        raise CommError(f"all_to_all_single: {what}_split_sizes {list(sizes)} must have {n} entries summing to "
                        f"dim 0 ({tensor.shape[0]})")
    return list(tensor.split(list(sizes)))


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
