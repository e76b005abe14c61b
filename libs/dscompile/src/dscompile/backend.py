"""The torch.compile backend: each graph dynamo captures is lowered through AOT autograd (inductor's, or
plain FX code for "aot_eager"), and the schedule entry's passes rewrite its forward, backward and
inference graphs on the way. At a schedule step every graph is compiled again from what dynamo captured.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from .activations import ForwardOutputs, forward_outputs, saved_activations
from .errors import DeepCompileError
from .graph import outputs, placeholders
from .graphinfo import BACKWARD, FORWARD, INFERENCE, GraphInfo, ParamSlot
from .passes import REGISTRY, record_inputs

logger = logging.getLogger("dscompile")

BACKENDS = ("inductor", "aot_eager", "eager")  # "eager": the reference's name for running the graphs as FX code


@dataclass
class _PairState:
    """What the backward graph of a forward needs to know about it."""

    fw_params: dict[str, ParamSlot] = field(default_factory=dict)
    fw_positions: dict[int, ParamSlot] = field(default_factory=dict)
    forward: ForwardOutputs | None = None
    num_saved: int | None = None
    offloaded: set[str] = field(default_factory=set)


class DeepCompileBackend:
    def __init__(self, runtime: Any, backend: str = "inductor", inductor_options: dict | None = None):
        if backend not in BACKENDS:
            raise DeepCompileError(f"backend {backend!r} cannot run DeepCompile's passes; use one of {list(BACKENDS)}")
        self.runtime = runtime
        self.backend = backend
        self.inductor_options = dict(inductor_options or {})
        self.graphs: list[ScheduledGraph] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> ScheduledGraph:
        graph = ScheduledGraph(self, len(self.graphs), gm, example_inputs)
        self.graphs.append(graph)
        return graph

    # ------------------------------------------------------------------ one compile of one captured graph
    def compile(self, index: int, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        runtime = self.runtime
        slots = [runtime.slot_of(t) for t in example_inputs]
        state = _PairState()
        passes = runtime.passes_now()

        def rewrite(module: fx.GraphModule, kind: str) -> fx.GraphModule:
            return self._rewrite(module, kind, index, slots, state, passes)

        partitioner = self._joint_partitioner(passes)

        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            def inner(module, inputs, **kwargs):
                kind = BACKWARD if kwargs.get("is_backward") else INFERENCE if kwargs.get("is_inference") else FORWARD
                if kind == FORWARD:
                    state.num_saved = _saved_count_from_meta(module)
                return compile_fx_inner(rewrite(module, kind), inputs, **kwargs)

            patches = {**self.inductor_options, "size_asserts": False, "fx_graph_cache": False}
            if partitioner is not None:
                patches["custom_partitioner_fn"] = partitioner
            with torch._functorch.config.patch(enable_autograd_cache=False):
                return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)

        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        def partition(joint, joint_inputs, **kwargs):
            # Parameters live on anyway: the partitioner should save them, not their views (which would keep the
            # gathered weights alive until backward). Dynamo marks them; a recompile's copy may not.
            static = set(kwargs.get("static_lifetime_input_indices") or ())
            kwargs["static_lifetime_input_indices"] = sorted(static | {i for i, s in enumerate(slots) if s})
            forward, backward = (partitioner or min_cut_rematerialization_partition)(joint, joint_inputs, **kwargs)
            state.num_saved = sum(1 for n in placeholders(backward.graph) if not n.name.startswith("tangents"))
            return forward, backward

        def compiler(kind: str):
            return lambda module, inputs: make_boxed_func(rewrite(module, kind).forward)

        with torch._functorch.config.patch(enable_autograd_cache=False):
            return aot_module_simplified(gm, example_inputs, fw_compiler=compiler(FORWARD),
                                         bw_compiler=compiler(BACKWARD), inference_compiler=compiler(INFERENCE),
                                         partition_fn=partition)

    def _joint_partitioner(self, passes: tuple[Any, ...]) -> Any:
        """The partitioner that runs the entry's joint passes first (long_context_checkpointing), or None."""
        if not any(isinstance(item, str) and REGISTRY[item].joint for item in passes):
            return None
        from .checkpointing import LongContextPartitioner

        counts = self.runtime.stats
        return LongContextPartitioner(self.runtime.budgets.long_context_min_seq_len,
                                      on_plan=lambda plan: counts.update(long_context_recomputed=len(plan.recomputed)))

    def _rewrite(self, module: fx.GraphModule, kind: str, index: int, slots: list[ParamSlot | None],
                 state: _PairState, passes: tuple[Any, ...]) -> fx.GraphModule:
        runtime = self.runtime
        graph_id = index * 3 + (FORWARD, BACKWARD, INFERENCE).index(kind)
        info: GraphInfo = runtime.graph_info(kind, graph_id)
        info.first_graph = index == 0
        inputs = placeholders(module.graph)
        if kind in (FORWARD, INFERENCE):
            if len(inputs) != len(slots):
                raise DeepCompileError(f"graph {index}: the {kind} graph takes {len(inputs)} inputs where torch.compile "
                                       f"captured {len(slots)}, so its parameters cannot be told apart")
            info.params = {n.name: s for n, s in zip(inputs, slots) if s is not None}
            state.fw_params = info.params
            state.fw_positions = {i: s for i, s in enumerate(slots) if s is not None}
            if kind == FORWARD:
                state.forward = forward_outputs(module.graph)
                if state.num_saved is not None:
                    info.saved_activations = saved_activations(state.forward, state.num_saved)
        else:
            names = {n.name for n in inputs}
            info.params = {name: s for name, s in state.fw_params.items() if name in names}
            if len(outputs(module.graph)) != len(slots):
                raise DeepCompileError(f"graph {index}: the backward graph returns {len(outputs(module.graph))} "
                                       f"gradients for {len(slots)} inputs; cannot match them to parameters")
            info.grad_outputs = state.fw_positions
            saved = [n for n in inputs if not n.name.startswith("tangents")]
            if state.forward is not None:
                found = saved_activations(state.forward, len(saved))
                info.activation_inputs = {name for name in found.values() if name in names}
            info.offloaded = state.offloaded
        self._log(f"{kind} graph {index} before the passes", module)
        for item in passes:
            function = REGISTRY[item].fn if isinstance(item, str) else item
            module.graph = function(module.graph, info) or module.graph
        if runtime.entry_index + 1 < len(runtime.schedule):  # a later entry may profile this graph
            module.graph = record_inputs(module.graph, info)
        module.recompile()
        if kind == FORWARD:
            state.offloaded = set(info.decisions.get("offloaded", ()))
        runtime.keep_graph(graph_id, copy.deepcopy(module), info)
        for key, value in info.decisions.items():
            if isinstance(value, int):
                runtime.stats[key] += value
        self._log(f"{kind} graph {index} after {[str(p) for p in passes]}", module)
        return module

    def _log(self, title: str, module: fx.GraphModule) -> None:
        if self.runtime.settings.debug_log and self.runtime.rank == 0:
            logger.info("DeepCompile %s:\n%s", title, module.graph)


def _saved_count_from_meta(module: fx.GraphModule) -> int | None:
    """How many of a forward graph's outputs backward saves, from inductor's note of the user-visible ones."""
    out = next(n for n in module.graph.nodes if n.op == "output")
    visible = out.meta.get("user_visible_output_idxs")
    if visible is None:
        return None
    total = len(outputs(module.graph))
    end = max(visible) + 1 if visible else 0
    return total - end


def copy_captured(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of a dynamo graph that AOT autograd still recognises as one (its placeholders' sources tell
    it which inputs are parameters, whose lifetime is static: the partitioner saves them, not their views)."""
    copied = copy.deepcopy(gm)
    sources = {n.name: n._dynamo_source for n in gm.graph.find_nodes(op="placeholder") if hasattr(n, "_dynamo_source")}
    for node in copied.graph.find_nodes(op="placeholder"):
        if node.name in sources:
            node._dynamo_source = sources[node.name]
    if hasattr(gm, "_param_name_to_source"):
        copied._param_name_to_source = gm._param_name_to_source
    copied.meta.update(gm.meta)
    return copied


class ScheduledGraph:
    """What dynamo runs for one captured graph: the compile for the schedule entry in force, made again
    when the entry changes (then specialised to the shapes of the call that needed it)."""

    def __init__(self, backend: DeepCompileBackend, index: int, gm: fx.GraphModule, example_inputs: list[Any]):
        self.backend = backend
        self.index = index
        self.original = copy_captured(gm)
        self.epoch = backend.runtime.epoch
        self.current = backend.compile(index, gm, list(example_inputs))
        self.by_shape: dict[tuple, Any] = {}

    def __call__(self, *args: Any) -> Any:
        runtime = self.backend.runtime
        if runtime.epoch != self.epoch:
            self.epoch = runtime.epoch
            self.by_shape = {}
            self.current = None
        if self.current is None:
            key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else repr(a) for a in args)
            compiled = self.by_shape.get(key)
            if compiled is None:
                gate = runtime.eager_gather
                gate.paused = True
                try:
                    compiled = self.backend.compile(self.index, copy_captured(self.original), list(args))
                finally:
                    gate.paused = False
                self.by_shape[key] = compiled
            return compiled(*args)
        return self.current(*args)


