"""Tokens to their experts and back, over the expert-parallel group.

Two ways, with the same result:
- dense (DeepSpeed's): einsum the tokens into a [experts, capacity, model] buffer with the
  [tokens, experts, capacity] dispatch mask, exchange equal blocks, run every expert on all its
  capacity slots (empty ones too), exchange back and einsum with the combine weights. Its cost
  grows with tokens x experts x capacity x model.
- sparse: gather only the kept routes' rows by index, exchange variable blocks (each rank first
  tells the others how many rows it sends each expert), run every expert on its real rows only, send
  them back and add each row, times its weight, into its token. Its cost grows with routes x model.

`choose_dispatch` ("auto") takes the sparse path on the CPU, where it measured faster at every size
tried (16 tokens x 2 experts to 512 tokens x 64 experts, BENCHMARKS.md), and over an expert-parallel
group (its ranks must take the same path, and their token counts may differ). On a GPU without
expert parallelism it takes dense while the buffers are small, where one einsum is one GEMM (that
threshold is not measured yet: no GPU run has been made).
"""

from __future__ import annotations

from typing import Any

import torch

from .all_to_all import all_to_all, exchange_counts
from .experts import Experts
from .gating import Routing

DISPATCH_MODES = ("auto", "dense", "sparse")
DENSE_MAX_ELEMENTS = 1 << 15  # [tokens x experts x capacity] up to which a GPU dispatches dense


def choose_dispatch(mode: str, num_tokens: int, num_experts: int, capacity: int, ep_size: int = 1,
                    device: torch.device | str = "cpu") -> str:
    """"dense" or "sparse" for `mode` ("auto": see the module's docstring)."""
    if mode != "auto":
        return mode
    if ep_size > 1 or torch.device(device).type == "cpu":
        return "sparse"
    return "dense" if num_tokens * num_experts * capacity <= DENSE_MAX_ELEMENTS else "sparse"


def dense_moe(x: torch.Tensor, routing: Routing, experts: Experts, group: Any, ep_size: int) -> torch.Tensor:
    """[tokens, model] -> [tokens, model] through DeepSpeed's einsum dispatch and equal all-to-alls."""
    combine, dispatch = routing.dense()
    model_dim = x.shape[-1]
    dispatched = torch.einsum("sec,sm->ecm", dispatch.type_as(x), x)
    if ep_size > 1:
        dispatched = all_to_all(dispatched, group)
    # After the exchange: [source rank, local expert, slot, model].
    local = experts.num_local_experts
    out = experts(dispatched.reshape(ep_size, local, -1, model_dim)).reshape(ep_size * local, -1, model_dim)
    if ep_size > 1:
        out = all_to_all(out, group)
    return torch.einsum("sec,ecm->sm", combine.type_as(x), out)


def sparse_moe(x: torch.Tensor, routing: Routing, experts: Experts, group: Any, ep_size: int) -> torch.Tensor:
    """[tokens, model] -> [tokens, model] moving only the kept routes' rows (variable all-to-alls)."""
    num_experts, local = routing.num_experts, experts.num_local_experts
    counts = torch.bincount(routing.experts, minlength=num_experts)
    # Rows are laid out expert by expert, each expert's in slot order (its slots are 0..count-1).
    starts = torch.cumsum(counts, 0) - counts
    position = starts[routing.experts] + routing.slots
    order = torch.empty_like(position)
    order[position] = torch.arange(position.numel(), device=position.device)
    tokens = routing.tokens[order]
    weights = routing.weights[order]
    rows = x.index_select(0, tokens)
    if ep_size == 1:
        out = torch.cat(experts.forward_rows(list(rows.split(counts.tolist()))))
    else:
        out = _through_remote_experts(rows, counts, experts, group, ep_size, local)
    return x.new_zeros(x.shape).index_add(0, tokens, out * weights.unsqueeze(1).to(out.dtype))


def _through_remote_experts(rows: torch.Tensor, counts: torch.Tensor, experts: Experts, group: Any, ep_size: int,
                            local: int) -> torch.Tensor:
    """Each rank's rows to the rank holding their expert and the experts' outputs back, in `rows`' order."""
    incoming = exchange_counts(counts, group).view(ep_size, local)  # [source rank, my local expert]
    send_splits = counts.view(ep_size, local).sum(dim=1).tolist()
    recv_splits = incoming.sum(dim=1).tolist()
    received = all_to_all(rows, group, recv_splits, send_splits)
    blocks = received.split(incoming.flatten().tolist())  # (source, local expert) blocks, sources first
    per_expert = [torch.cat([blocks[source * local + e] for source in range(ep_size)]) for e in range(local)]
    outputs = experts.forward_rows(per_expert)
    pieces = [out.split(incoming[:, e].tolist()) for e, out in enumerate(outputs)]
    returned = torch.cat([pieces[e][source] for source in range(ep_size) for e in range(local)])
    return all_to_all(returned, group, send_splits, recv_splits)
