"""The torch edge of long_context_checkpointing: a partitioner that tags AOT autograd's joint graph
(passes/long_context.py) and hands it to torch's min-cut partitioner, and a torch.compile backend built on
it, for code that compiles without DeepCompile's ZeRO passes (AutoSP, a plainly compiled model).

    backend = dscompile.long_context_backend("inductor")     # or "aot_eager"
    model.compile(backend=backend)
    ...
    backend.partitioner.plans                                  # what each graph's pass chose
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files

from .errors import DeepCompileError
from .graph import placeholders
from .passes import long_context
from .passes.long_context import LongContextPlan, long_context_checkpointing

logger = logging.getLogger("dscompile")

LONG_CONTEXT_BACKENDS = ("inductor", "aot_eager")


class LongContextPartitioner(CustomPartitionerFn):
    """Tag, then partition with min-cut (inductor takes it as `custom_partitioner_fn`; AOT autograd as
    `partition_fn`). Each call's plan, and the bytes the backward graph takes from the forward, are kept;
    with keep_graphs, also the joint graph as tagged and the backward graph made from it (tests, debugging);
    on_plan is called with each plan (DeepCompile counts them in its runtime's stats)."""

    def __init__(self, min_seq_len: int | None = None, keep_graphs: bool = False,
                 on_plan: Callable[[LongContextPlan], None] | None = None):
        if min_seq_len is None:  # read when built, so a run (or a test) may lower the module's threshold
            min_seq_len = long_context.MIN_SEQ_LEN
        if isinstance(min_seq_len, bool) or not isinstance(min_seq_len, int) or min_seq_len < 1:
            raise DeepCompileError(f"long_context_checkpointing: min_seq_len must be a positive int (tokens per "
                                   f"rank), got {min_seq_len!r}")
        self.min_seq_len = min_seq_len
        self.plans: list[LongContextPlan] = []
        self.saved_bytes: list[int] = []  # per graph: the activations backward reads from forward
        self.keep_graphs = keep_graphs
        self.on_plan = on_plan
        self.graphs: list[tuple[fx.Graph, fx.Graph]] = []

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
                 ) -> tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        static = kwargs.get("static_lifetime_input_indices") or ()
        plan = long_context_checkpointing(gm.graph, self.min_seq_len, static, kwargs.get("num_fwd_outputs"))
        self.plans.append(plan)
        if self.on_plan is not None:
            self.on_plan(plan)
        if plan.active:
            logger.info("long_context_checkpointing: %d node(s) recomputed, %d saved, %d attention region(s), "
                        "longest sequence %d", len(plan.recomputed), len(plan.saved), plan.attention + 1,
                        plan.longest)
        forward, backward = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.saved_bytes.append(saved_activation_bytes(backward.graph))
        if self.keep_graphs:
            self.graphs.append((gm.graph, backward.graph))
        return forward, backward

    def uuid(self) -> Any:
        # inductor's caches key on it: the pass's source and its threshold
        return (get_hash_for_files((__file__, long_context.__file__)), self.min_seq_len)


def saved_activation_bytes(backward: fx.Graph) -> int:
    """Bytes of the tensors a backward graph takes from its forward (its inputs that are not tangents)."""
    total = 0
    for node in placeholders(backward):
        value = node.meta.get("val")
        if node.name.startswith("tangents") or not isinstance(value, torch.Tensor):
            continue
        total += value.numel() * value.element_size()
    return total


class LongContextBackend:
    """A torch.compile backend: AOT autograd with the long-context partitioner, lowered by inductor or run
    as FX code ("aot_eager")."""

    def __init__(self, backend: str = "inductor", min_seq_len: int | None = None, keep_graphs: bool = False):
        if backend not in LONG_CONTEXT_BACKENDS:
            raise DeepCompileError(f"long_context_checkpointing runs in AOT autograd's partitioner: backend "
                                   f"{backend!r} has none; use one of {list(LONG_CONTEXT_BACKENDS)}")
        self.backend = backend
        self.partitioner = LongContextPartitioner(min_seq_len, keep_graphs)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": self.partitioner})
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def boxed(module: fx.GraphModule, _inputs: list[Any]) -> Any:
            return make_boxed_func(module.forward)

        with torch._functorch.config.patch(enable_autograd_cache=False):
            return aot_module_simplified(gm, example_inputs, fw_compiler=boxed, bw_compiler=boxed,
                                         partition_fn=self.partitioner)


def long_context_backend(backend: str = "inductor", min_seq_len: int | None = None,
                         keep_graphs: bool = False) -> LongContextBackend:
    """A torch.compile backend running long_context_checkpointing before the partition; min_seq_len:
    tokens per rank from which activations are recomputed (default `passes.long_context.MIN_SEQ_LEN`,
    4096 as DeepSpeed's)."""
    return LongContextBackend(backend, min_seq_len, keep_graphs)
