"""long_context_checkpointing: selective activation checkpointing for long sequences, the companion of
AutoSP (DeepSpeed registers its own version with `"passes": ["autosp"]`).

At long sequence lengths the activations that grow with the sequence are what fills a rank, and most of
them are cheap to compute again: norms, projections, the MLP, rotary terms, the logits. Attention is not
(its cost grows with the square of the length), a collective would run again in backward on every rank,
and a random op would draw other numbers. The pass works on AOT autograd's joint graph, before the
partitioner splits it, and tags the forward nodes with torch's checkpoint policies, which the min-cut
partitioner honours:

- MUST_SAVE: attention (every aten scaled-dot-product / flash / efficient kernel), collectives and other
  ops outside aten and prims (dsseq's all-to-all, c10d, dscompile's own ops), random ops.
- MUST_RECOMPUTE: every other forward node whose value is sequence-long (a dimension other than the last,
  the feature dimension, of at least `min_seq_len` elements) and that is computed from an activation (not
  from parameters alone).

Nodes are grouped into regions cut at each attention call (`ac_graph_id`, as torch's checkpoint regions
are numbered): a recomputed value read by a later region is saved instead (the partitioner's own rule
for consecutive checkpointed regions), so backward recomputes one layer's chain at a time from the
residual stream at the layer's attention, not the whole network from its inputs. Below `min_seq_len`
nothing is tagged and the partition is the backend's own. A graph with no attention is left alone
(without an attention to keep, recomputing would redo the costliest work), and so is one the model already
checkpoints (torch.utils.checkpoint's tags: its regions decide).

DeepSpeed's pass rewrites the partitioner's ban rule (attention and random ops always saved, nodes whose
shape[1] reaches 4096 allowed to be recomputed); here the choice is data on the nodes, a pure function of
the graph, so it is visible in the graph and testable without compiling.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from ..errors import DeepCompileError

MIN_SEQ_LEN = 4096  # the reference's threshold: from this many tokens per rank, activations are recomputed

_aten = torch.ops.aten
_ATTENTION_PACKETS = (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward", "_efficient_attention_forward",
    "scaled_dot_product_attention",
)
ATTENTION = frozenset(getattr(_aten, name) for name in _ATTENTION_PACKETS if hasattr(_aten, name))
_COMPUTE_NAMESPACES = ("aten", "prims")


@dataclass
class LongContextPlan:
    """What the pass chose for one joint graph (read by tests and logs; the choice itself is on the nodes)."""

    min_seq_len: int
    attention: int = 0  # attention calls found (region boundaries)
    saved: list[str] = field(default_factory=list)  # nodes tagged MUST_SAVE
    recomputed: list[str] = field(default_factory=list)  # nodes tagged MUST_RECOMPUTE
    longest: int = 0  # the longest non-feature dimension of a forward activation
    already_checkpointed: bool = False  # the graph came with checkpoint tags (torch.utils.checkpoint): left alone

    @property
    def active(self) -> bool:
        return bool(self.recomputed)


def _packet(node: fx.Node):
    target = node.target
    return getattr(target, "overloadpacket", None)


def is_attention(node: fx.Node) -> bool:
    return node.op == "call_function" and _packet(node) in ATTENTION


def _must_save(node: fx.Node) -> bool:
    """Costly or unrepeatable: attention, collectives and other non-aten ops, random ops."""
    if is_attention(node):
        return True
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace not in _COMPUTE_NAMESPACES:
            return True
        return torch.Tag.nondeterministic_seeded in target.tags
    return False


def _sequence_extent(node: fx.Node) -> int:
    """The longest dimension of a node's tensor value other than the last (the feature dimension)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return 0
    sizes = [s for s in value.shape[:-1] if isinstance(s, int)]
    return max(sizes, default=0)


def forward_nodes(graph: fx.Graph, num_fwd_outputs: int | None = None) -> list[fx.Node]:
    """The joint graph's forward computation: the call_function nodes its first `num_fwd_outputs` outputs
    need (AOT's split), or, without that number, those no tangent reaches."""
    if num_fwd_outputs is not None:
        output = next(n for n in reversed(graph.nodes) if n.op == "output")
        values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        needed: set[fx.Node] = set()
        stack = [v for v in values[:num_fwd_outputs] if isinstance(v, fx.Node)]
        while stack:
            node = stack.pop()
            if node not in needed:
                needed.add(node)
                stack.extend(node.all_input_nodes)
        return [n for n in graph.nodes if n.op == "call_function" and n in needed]
    backward = {n for n in graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")}
    for node in graph.nodes:
        if node.op == "call_function" and any(arg in backward for arg in node.all_input_nodes):
            backward.add(node)
    return [n for n in graph.nodes if n.op == "call_function" and n not in backward]


def long_context_checkpointing(graph: fx.Graph, min_seq_len: int = MIN_SEQ_LEN, static_inputs: Iterable[int] = (),
                               num_fwd_outputs: int | None = None) -> LongContextPlan:
    """Tag the forward nodes of the AOT joint graph `graph` in place (node.meta "recompute" and
    "ac_graph_id"). static_inputs: indices of the primal placeholders that are parameters (their
    nodes alone are never activations); num_fwd_outputs: how many of the graph's outputs are the
    forward's (the partitioner's argument)."""
    if isinstance(min_seq_len, bool) or not isinstance(min_seq_len, int) or min_seq_len < 1:
        raise DeepCompileError(f"long_context_checkpointing: min_seq_len must be a positive int (tokens per rank), "
                               f"got {min_seq_len!r}")
    plan = LongContextPlan(min_seq_len)
    primals = [n for n in graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    static = {primals[i] for i in static_inputs if 0 <= i < len(primals)}
    computed: list[fx.Node] = forward_nodes(graph, num_fwd_outputs)
    if any("recompute" in n.meta for n in computed):
        plan.already_checkpointed = True  # the model's own activation checkpointing decides; not mixed with ours
        return plan
    if not any(is_attention(n) for n in computed):
        return plan
    from_activation = {n for n in primals if n not in static}
    region = 1
    for node in computed:
        if any(arg in from_activation for arg in node.all_input_nodes):
            from_activation.add(node)
        extent = _sequence_extent(node)
        plan.longest = max(plan.longest, extent)
        if node.target is operator.getitem:  # an item of a tuple follows its producer into its region
            source = node.args[0]
            if isinstance(source, fx.Node) and source.meta.get("recompute") == CheckpointPolicy.MUST_RECOMPUTE:
                node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                node.meta["ac_graph_id"] = source.meta["ac_graph_id"]
            continue
        if _must_save(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            plan.saved.append(node.name)
            if is_attention(node):
                plan.attention += 1
                region += 1  # what comes after this attention is the next region
            continue
        if extent >= min_seq_len and node in from_activation:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            node.meta["ac_graph_id"] = region
            plan.recomputed.append(node.name)
    if not plan.recomputed:  # short sequences: leave the partition to the backend
        for node in computed:
            node.meta.pop("recompute", None)
            node.meta.pop("ac_graph_id", None)
        plan.saved.clear()
    return plan
