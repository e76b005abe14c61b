"""The operators the passes insert: ZeRO's gathers, releases and reductions, and the offload and free
operators, as torch.library ops a compiled graph can hold (inductor calls them as fallback kernels).

Each op names its runtime (an int from `register_runtime`) and its unit, parameter or tensor key, and
carries the sizes its fake implementation needs, so tracing and lowering never ask a runtime anything.
Ordering is data: a gather's buffer flows into its wait, a release or free takes the outputs of the
nodes that read the memory it lets go of (`after`), so no compiler may move it before them. Ops that
return nothing are registered as side-effecting, so no pass of torch's removes them.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import fx

_LIB = torch.library.Library("dscompile", "DEF")
_SCHEMAS = {
    # Starts the all-gather of one stage-3 unit into a buffer the graph owns; `deps` orders it after them.
    "gather": "gather(Tensor anchor, Tensor[] deps, int runtime, int unit, SymInt numel, ScalarType dtype) -> Tensor",
    "wait_gather": "wait_gather(Tensor(a) buffer, int runtime, int unit) -> Tensor(a)",
    "release": "release(Tensor buffer, Tensor[] after, int runtime, int unit) -> ()",
    "reduce_grad": "reduce_grad(Tensor grad, int runtime, int param) -> ()",
    "free_tensors": "free_tensors(Tensor[] tensors, Tensor[] after, int runtime) -> ()",
    "offload_tensor": "offload_tensor(Tensor x, int runtime, int key) -> Tensor",
    "reload_tensor": "reload_tensor(Tensor x, Tensor[] deps, int runtime, int key) -> Tensor",
    "offload_states": "offload_states(Tensor anchor, int runtime) -> ()",
    "reload_states": "reload_states(Tensor[] after, int runtime) -> ()",
    "offload_param": "offload_param(Tensor[] after, int runtime, int unit) -> ()",
    "reload_param": "reload_param(Tensor anchor, int runtime, int unit) -> Tensor",
    "record_inputs": "record_inputs(Tensor[] inputs, int runtime, int graph) -> ()",
}
for _schema in _SCHEMAS.values():
    _LIB.define(_schema)

_RUNTIMES: dict[int, weakref.ref] = {}
_NEXT_ID = [0]


def register_runtime(runtime: Any) -> int:
    """An id for `runtime` that graphs name in their ops (held weakly: a closed engine goes away)."""
    _NEXT_ID[0] += 1
    _RUNTIMES[_NEXT_ID[0]] = weakref.ref(runtime)
    return _NEXT_ID[0]


def unregister_runtime(runtime_id: int) -> None:
    _RUNTIMES.pop(runtime_id, None)


def runtime(runtime_id: int) -> Any:
    ref = _RUNTIMES.get(runtime_id)
    found = ref() if ref is not None else None
    if found is None:
        raise RuntimeError(f"dscompile: a compiled graph calls runtime {runtime_id}, which was closed; compile the "
                           f"module again (engine.compile()) after building a new engine")
    return found


# ---------------------------------------------------------------------- real implementations
def _gather(anchor, deps, runtime_id, unit, numel, dtype):
    return runtime(runtime_id).op_gather(unit, int(numel), dtype, anchor.device)


def _wait_gather(buffer, runtime_id, unit):
    runtime(runtime_id).op_wait_gather(unit, buffer)
    return buffer


def _release(buffer, after, runtime_id, unit):
    runtime(runtime_id).op_release(unit, buffer)


def _reduce_grad(grad, runtime_id, param):
    runtime(runtime_id).op_reduce_grad(param, grad)


def _free_tensors(tensors, after, runtime_id):
    runtime(runtime_id).op_free_tensors(tensors)


def _offload_tensor(x, runtime_id, key):
    return runtime(runtime_id).op_offload_tensor(key, x)


def _reload_tensor(x, deps, runtime_id, key):
    return runtime(runtime_id).op_reload_tensor(key, x)


def _offload_states(anchor, runtime_id):
    runtime(runtime_id).op_offload_states()


def _reload_states(after, runtime_id):
    runtime(runtime_id).op_reload_states()


def _offload_param(after, runtime_id, unit):
    runtime(runtime_id).op_offload_param(unit)


def _reload_param(anchor, runtime_id, unit):
    runtime(runtime_id).op_reload_param(unit)
    return anchor.new_empty(0)


def _record_inputs(inputs, runtime_id, graph):
    runtime(runtime_id).op_record_inputs(graph, inputs)


# ---------------------------------------------------------------------- fake implementations (shapes only)
def _gather_fake(anchor, deps, runtime_id, unit, numel, dtype):
    return anchor.new_empty(numel, dtype=dtype)


def _wait_gather_fake(buffer, runtime_id, unit):
    return buffer


def _nothing(*args):
    return None


def _offload_tensor_fake(x, runtime_id, key):
    return torch.empty_like(x)


def _reload_tensor_fake(x, deps, runtime_id, key):
    return torch.empty_like(x)


def _reload_param_fake(anchor, runtime_id, unit):
    return anchor.new_empty(0)


_IMPLS = {
    "gather": (_gather, _gather_fake), "wait_gather": (_wait_gather, _wait_gather_fake),
    "release": (_release, _nothing), "reduce_grad": (_reduce_grad, _nothing),
    "free_tensors": (_free_tensors, _nothing), "offload_tensor": (_offload_tensor, _offload_tensor_fake),
    "reload_tensor": (_reload_tensor, _reload_tensor_fake), "offload_states": (_offload_states, _nothing),
    "reload_states": (_reload_states, _nothing), "offload_param": (_offload_param, _nothing),
    "reload_param": (_reload_param, _reload_param_fake), "record_inputs": (_record_inputs, _nothing),
}
for _name, (_real, _fake) in _IMPLS.items():
    _LIB.impl(_name, _real, "CompositeExplicitAutograd")
    _LIB.impl(_name, _fake, "Meta")

_ops = torch.ops.dscompile
gather = _ops.gather.default
wait_gather = _ops.wait_gather.default
release = _ops.release.default
reduce_grad = _ops.reduce_grad.default
free_tensors = _ops.free_tensors.default
offload_tensor = _ops.offload_tensor.default
reload_tensor = _ops.reload_tensor.default
offload_states = _ops.offload_states.default
reload_states = _ops.reload_states.default
offload_param = _ops.offload_param.default
reload_param = _ops.reload_param.default
record_inputs = _ops.record_inputs.default

# Ops kept for what they do, not for a value: no dead-code elimination may drop them.
SIDE_EFFECTS = (gather, release, reduce_grad, free_tensors, offload_states, reload_states, offload_param,
                reload_param, record_inputs)
for _op in SIDE_EFFECTS:
    fx.node.has_side_effect(_op)

ALL = tuple(getattr(_ops, name).default for name in _SCHEMAS)
# Ops that do not read their tensor inputs' memory (they only order, or hand memory back).
BOOKKEEPING = (release, free_tensors, reload_states, offload_param, record_inputs)
