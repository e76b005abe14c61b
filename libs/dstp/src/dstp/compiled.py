"""Hand a tensor-parallel model's collectives to a compiler (DeepCompile's autotp pass).

`defer_collectives_to_compiler(model)` turns the column- and row-parallel layers' own region boundaries
off, after checking that every collective the model needs is one the pass can emit in its place: the
entry of a column-parallel linear and the exit of a row-parallel one. What it cannot stand in for is
refused by name, since leaving it to the layers under a compiled graph would drop its collective.
"""

from __future__ import annotations

from torch import nn

from .apply import _named_modules, state_of
from .errors import TensorParallelError
from .layers import ColumnParallelLinear, RowParallelLinear


def defer_collectives_to_compiler(model: nn.Module) -> dict[str, str]:
    """{module name: "column" | "row"} of the layers whose collectives the compiler now emits."""
    state = state_of(model)
    if state is None:
        raise TensorParallelError("defer_collectives_to_compiler: the model is not tensor-parallel "
                                  "(dstp.parallelize(...) has not cut it)")
    group = state.tensor_group
    if group.overlap is not None:
        raise TensorParallelError("the autotp pass does not run the two half-batches of tp_overlap_comm; set "
                                  "tensor_parallel.tp_overlap_comm to false to emit the collectives into the graph")
    problems, layers = [], {}
    for pp in state.plan.params.values():
        if pp.kind == "vocab":
            problems.append(f"{pp.name} (vocab_parallel_lm_head: its loss communicates inside)")
    for name, module in _named_modules(model).items():
        if isinstance(module, ColumnParallelLinear):
            if module.gather_output:
                problems.append(f"{name} (a column-parallel layer that gathers its output)")
            layers[name] = "column"
        elif isinstance(module, RowParallelLinear):
            if module.split_input:
                problems.append(f"{name} (a row-parallel layer that splits its input)")
            layers[name] = "row"
        elif not isinstance(module, nn.Linear):
            own = [state.plan.params.get(f"{name}.{p}" if name else p) for p, _ in module.named_parameters(recurse=False)]
            if any(pp is not None and pp.sharded for pp in own):
                problems.append(f"{name} ({type(module).__name__}: cut weights used by the module itself, whose "
                                f"region is entered and left by hooks)")
    if problems:
        raise TensorParallelError(f"the autotp pass cannot emit the collectives of: {'; '.join(problems[:5])}"
                                  f"{' ...' if len(problems) > 5 else ''}; drop 'autotp' from compile.passes for "
                                  f"this model (its eager AutoTP layers communicate themselves)")
    group.in_graph = True
    return layers


def restore_collectives(model: nn.Module) -> None:
    """The layers communicate themselves again (the model runs eagerly)."""
    state = state_of(model)
    if state is not None:
        state.tensor_group.in_graph = False
