"""AutoSP: Ulysses sequence parallelism inserted by a compiler pass (DeepSpeed's `"passes": ["autosp"]`).

    input_ids, labels, position_ids, attention_mask = prepare_autosp_inputs(input_ids, labels)
    runtime = compile_autosp(model, sequence_group)                  # model.forward now runs the compiled graph
    loss = model(input_ids=input_ids, labels=labels, position_ids=position_ids).loss   # whole sequence in

Every rank of the sequence group is given the whole sequence. What torch.compile captures is this rank's
step: the sequence inputs cut to its slice (`narrow` at the graph's entry, so every shape after it is the
slice's), the model, and the loss. The pass (`insert_ulysses`) then finds each scaled-dot-product attention
in the captured graphs and puts the all-to-alls around it: q, k and v go from every head of the slice to
the whole sequence of this rank's heads (key/value heads split by their groups, repeated when there are
fewer than ranks), the attention runs causally on the whole sequence, and its output comes back to the
slice. Positions are the whole sequence's (prepare_autosp_inputs makes them when absent), so rotary
embeddings see global positions; labels are shifted once over the whole sequence before the cut; the loss
is the sum of every rank's token losses over the count of every valid label, the number one rank on the
whole sequence gets. Its gradient follows dsseq.sum_over_ranks: averaged over the sequence ranks (as
ZeRO's sequence x data group does) the gradients are those of one rank on the whole sequence.

Refused, by name: inputs not prepared; a padding mask (the mask the model would build is the slice's);
attention with an explicit mask (a sliding window shorter than the sequence); head counts Ulysses cannot
split; a sequence not divisible by the size; a model in which the pass found no attention at all
(an attention implementation other than "sdpa").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .comm import group_rank, group_size
from .errors import SequenceParallelError
from .heads import split_heads
from .loss import IGNORE_INDEX, shift_labels
from .ops import group_name

_TAG = "_dsseq_autosp_seq_dim"
_SDPA_TARGETS = (torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def prepare_autosp_inputs(input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None = None,
                          attention_mask: torch.Tensor | None = None, seq_dim: int = 1) -> tuple:
    """The inputs of one AutoSP step, whole sequence on every rank: `(input_ids, labels, position_ids,
    attention_mask)`, marked for the pass. Positions default to 0..seq-1; an attention mask may only mark
    every token (it is dropped: causal attention over the whole sequence is what it says)."""
    for name, tensor in (("input_ids", input_ids), ("labels", labels)):
        if not torch.is_tensor(tensor) or tensor.dim() < 2:
            raise SequenceParallelError(f"prepare_autosp_inputs: {name} must be a [batch, seq] tensor, got "
                                        f"{tuple(tensor.shape) if torch.is_tensor(tensor) else type(tensor).__name__}")
    seq_dim %= input_ids.dim()
    if labels.shape != input_ids.shape:
        raise SequenceParallelError(f"prepare_autosp_inputs: labels {tuple(labels.shape)} and input_ids "
                                    f"{tuple(input_ids.shape)} differ in shape")
    length = input_ids.shape[seq_dim]
    if position_ids is None:
        shape = [1] * input_ids.dim()
        shape[seq_dim] = length
        position_ids = torch.arange(length, device=input_ids.device).view(shape).expand_as(input_ids)
    elif position_ids.shape[seq_dim % position_ids.dim()] != length:
        raise SequenceParallelError(f"prepare_autosp_inputs: position_ids {tuple(position_ids.shape)} do not cover "
                                    f"the {length} tokens of input_ids (dimension {seq_dim})")
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise SequenceParallelError(f"prepare_autosp_inputs: attention_mask {tuple(attention_mask.shape)} and "
                                        f"input_ids {tuple(input_ids.shape)} differ in shape")
        if not bool(attention_mask.bool().all()):
            raise SequenceParallelError("prepare_autosp_inputs: attention_mask has padding (zeros); AutoSP runs causal "
                                        "attention over whole sequences: pack the samples or pad with labels -100 and "
                                        "pass attention_mask=None")
        attention_mask = None
    for tensor in (input_ids, labels, position_ids):
        setattr(tensor, _TAG, seq_dim)
    return input_ids, labels, position_ids, attention_mask


# -------------------------------------------------------------------------------------------- the pass
def find_attention(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The scaled-dot-product attention calls of a graph captured by dynamo."""
    return [node for node in graph.nodes if node.op == "call_function" and node.target in _SDPA_TARGETS]


def _arguments(node: torch.fx.Node) -> dict[str, Any]:
    named = dict(zip(_SDPA_ARGS, node.args))
    named.update(node.kwargs)
    return named


def _shape(node: Any) -> tuple[int, ...]:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    if value is None or not hasattr(value, "shape"):
        raise SequenceParallelError(f"AutoSP: the attention input {node} carries no traced shape; the pass needs the "
                                    f"graph dynamo captured")
    return tuple(value.shape)


def insert_ulysses(gm: torch.fx.GraphModule, group: str, sp: int) -> int:
    """The pass: each attention call of `gm` runs on the whole sequence of this rank's heads, between
    all-to-alls over the process group named `group` (`sp` ranks). Returns how many it rewrote."""
    graph = gm.graph
    rewritten = 0
    for node in find_attention(graph):
        args = _arguments(node)
        where = f"AutoSP, attention node {node.name}"
        if args.get("attn_mask") is not None:
            raise SequenceParallelError(f"{where}: the attention has an explicit mask (padding or a sliding window "
                                        f"shorter than the sequence), built from this rank's slice; AutoSP runs "
                                        f"causal attention without a mask only")
        q_shape, k_shape = _shape(args["query"]), _shape(args["key"])
        if len(q_shape) < 3:
            raise SequenceParallelError(f"{where}: query of shape {q_shape} has no [heads, seq, dim] layout")
        heads_dim, seq_dim = len(q_shape) - 3, len(q_shape) - 2
        split = split_heads(q_shape[heads_dim], k_shape[heads_dim], sp, where)
        with graph.inserting_before(node):
            key, value = args["key"], args["value"]
            if split.kv_repeat > 1:
                key, value = (graph.call_function(torch.repeat_interleave, (t, split.kv_repeat), {"dim": heads_dim})
                              for t in (key, value))
            q, k, v = (graph.call_function(torch.ops.dsseq.all_to_all.default, (t, heads_dim, seq_dim, group))
                       for t in (args["query"], key, value))
            rest = {name: value for name, value in args.items() if name not in ("query", "key", "value")}
            attention = graph.call_function(node.target, (q, k, v), rest)
        with graph.inserting_after(attention):
            back = graph.call_function(torch.ops.dsseq.all_to_all.default, (attention, seq_dim, heads_dim, group))
        node.replace_all_uses_with(back)
        graph.erase_node(node)
        rewritten += 1
    graph.lint()
    gm.recompile()
    return rewritten


# ------------------------------------------------------------------------------------------ the runtime
@dataclass
class AutoSPRuntime:
    """What compile_autosp did to a module: the group, the backend and how many attention calls the
    pass rewrote in each graph it compiled (`attention_per_graph`)."""

    module: torch.nn.Module
    group: Any
    sp: int
    rank: int
    backend: str | Callable[..., Any]  # a torch.compile backend: its name or the callable
    original_forward: Callable[..., Any]
    attention_per_graph: list[int] = field(default_factory=list)
    _compiled: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        self.group_label = group_name(self.group)  # a string the graph can hold

    def backend_fn(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        self.attention_per_graph.append(insert_ulysses(gm, self.group_label, self.sp))
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor, count: torch.Tensor,
             seq_dim: int, kwargs: dict) -> tuple[torch.Tensor, Any]:
        """One rank's part, as torch.compile captures it: the slice, the model, the loss of every rank."""
        chunk = input_ids.shape[seq_dim] // self.sp
        start = self.rank * chunk
        output = self.original_forward(input_ids=input_ids.narrow(seq_dim, start, chunk),
                                                position_ids=position_ids.narrow(seq_dim, start, chunk), **kwargs)
        logits = output.logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        local = labels.narrow(seq_dim, start, chunk)
        token_sum = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), local.reshape(-1),
                                                      ignore_index=IGNORE_INDEX, reduction="sum")
        return torch.ops.dsseq.sum_over_ranks(token_sum, self.group_label) / count, output

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise SequenceParallelError(f"AutoSP: call the model with keywords (input_ids=..., labels=..., "
                                        f"position_ids=...), as prepare_autosp_inputs returns them; got {len(args)} "
                                        f"positional argument(s)")
        prepared = {name: kwargs.pop(name, None) for name in ("input_ids", "labels", "position_ids")}
        for name, tensor in prepared.items():
            if tensor is None or not hasattr(tensor, _TAG):
                raise SequenceParallelError(f"AutoSP: {name} was not prepared; pass the whole sequence through "
                                            f"prepare_autosp_inputs(input_ids, labels, position_ids, attention_mask) "
                                            f"and the model's call the tensors it returns (else a rank would train "
                                            f"unsharded)")
        mask = kwargs.pop("attention_mask", None)
        if mask is not None:
            raise SequenceParallelError("AutoSP: attention_mask must be None (prepare_autosp_inputs drops a mask of "
                                        "all ones and refuses padding)")
        seq_dim = getattr(prepared["input_ids"], _TAG)
        length = prepared["input_ids"].shape[seq_dim]
        if length % self.sp:
            lower = length // self.sp * self.sp
            raise SequenceParallelError(f"AutoSP: sequence length {length} (input_ids dimension {seq_dim}) is not "
                                        f"divisible by the sequence-parallel size {self.sp}; pad or cut it to a "
                                        f"multiple of {self.sp} (e.g. {lower or self.sp} or {lower + self.sp})")
        shifted = shift_labels(prepared["labels"], seq_dim=seq_dim)
        count = (shifted != IGNORE_INDEX).sum().clamp(min=1).to(torch.float32)
        graphs_before = len(self.attention_per_graph)
        try:
            loss, output = self._compiled(prepared["input_ids"], shifted, prepared["position_ids"], count, seq_dim,
                                          kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            inner = getattr(exc, "inner_exception", None)
            if isinstance(inner, SequenceParallelError):
                raise inner from None
            raise
        if len(self.attention_per_graph) > graphs_before and not sum(self.attention_per_graph):
            raise SequenceParallelError(
                f"AutoSP: the pass found no scaled-dot-product attention in the graphs of "
                f"{type(self.module).__name__}, so it cannot shard it (Llama, Qwen2, Mistral and other Hugging Face "
                f"causal LMs load with attn_implementation=\"sdpa\"); refusing to train each rank unsharded")
        output.loss = loss
        return output


def compile_autosp(module: torch.nn.Module, group: Any, backend: str | Callable[..., Any] = "inductor",
                   compile_kwargs: dict | None = None) -> AutoSPRuntime:
    """Compile `module` with AutoSP over the sequence `group`, in place: calling it runs the compiled
    step (prepared inputs, whole sequence in; the output's `loss` is the whole sequence's). `backend`: a
    torch.compile backend's name or callable, given each graph after the pass (dscompile's
    long_context_backend adds long-context activation checkpointing)."""
    if isinstance(getattr(module.forward, "__self__", None), AutoSPRuntime):
        raise SequenceParallelError(f"compile_autosp: {type(module).__name__} is already compiled with AutoSP")
    runtime = AutoSPRuntime(module, group, group_size(group), group_rank(group), backend, module.forward)
    runtime._compiled = torch.compile(runtime.step, backend=runtime.backend_fn, **(compile_kwargs or {}))
    module.forward = runtime.forward
    return runtime


def uncompile_autosp(runtime: AutoSPRuntime) -> None:
    """The module runs its own forward again."""
    if getattr(runtime.module.forward, "__self__", None) is runtime:
        del runtime.module.forward
