"""The profiling run: each graph of the schedule entry in force is run once more, node by node, on the inputs
kept from its last real call, to time its nodes; later entries' passes plan with those times.

Which input values are kept is compile.keep_int_input_tensors / keep_all_input_tensors: integer tensors
(token ids, positions: their values decide what an embedding reads) are kept by default, others only as
shape and dtype and filled with zeros for the run, so keeping costs no memory. ZeRO parameters are
kept as the parameters themselves (the graph reads them through its gathers, or they are whole).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import fx


@dataclass(frozen=True)
class _Spec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def make(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device).zero_()


class InputStore:
    def __init__(self, keep_int: bool = True, keep_all: bool = False):
        self.keep_int = keep_int
        self.keep_all = keep_all
        self.stored: dict[int, list[torch.Tensor | _Spec]] = {}

    def keeps(self, tensor: torch.Tensor) -> bool:
        if isinstance(tensor, torch.nn.Parameter) or tensor.untyped_storage().nbytes() == 0:
            return True  # a parameter (or its partitioned placeholder): held anyway, never copied
        if self.keep_all:
            return True
        return self.keep_int and not (tensor.is_floating_point() or tensor.is_complex())

    def record(self, graph_id: int, tensors: list[torch.Tensor]) -> None:
        kept: list[torch.Tensor | _Spec] = []
        for tensor in tensors:
            if not self.keeps(tensor):
                kept.append(_Spec(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device))
            elif isinstance(tensor, torch.nn.Parameter) or tensor.untyped_storage().nbytes() == 0 or self.keep_all:
                kept.append(tensor)
            else:
                kept.append(tensor.detach().clone())  # a small integer tensor: its value at this call
        self.stored[graph_id] = kept

    def inputs(self, graph_id: int) -> list[torch.Tensor] | None:
        kept = self.stored.get(graph_id)
        if kept is None:
            return None
        return [item.make() if isinstance(item, _Spec) else item for item in kept]

    def clear(self) -> None:
        self.stored.clear()


class TimingInterpreter(fx.Interpreter):
    """Runs a graph node by node and notes each node's wall time (the device synchronised on CUDA)."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module, garbage_collect_values=True)
        self.seconds: dict[str, float] = {}
        self.cuda = torch.cuda.is_available()

    def run_node(self, node: fx.Node):
        start = time.perf_counter()
        result = super().run_node(node)
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds[node.name] = time.perf_counter() - start
        return result


def time_graph(module: fx.GraphModule, inputs: list[torch.Tensor]) -> dict[str, float]:
    interpreter = TimingInterpreter(module)
    with torch.no_grad():
        interpreter.run(*inputs)
    return interpreter.seconds
