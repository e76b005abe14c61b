"""Small models' forward and backward graphs as AOT autograd makes them, and a stand-in runtime that
serves the ops from local tensors, so the passes are tested on real graphs without processes."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from functorch.compile import make_boxed_func
from torch import fx, nn
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from dscompile import ops
from dscompile.graphinfo import BACKWARD, FORWARD, GraphInfo, ParamSlot, UnitSlot


class MLP(nn.Module):
    def __init__(self, d: int = 8, hidden: int = 32, vocab: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.down(torch.relu(self.up(x)))
        return (self.head(x).sum(-1),)


@dataclass
class Captured:
    model: nn.Module
    inputs: list[torch.Tensor]
    forward: fx.GraphModule
    backward: fx.GraphModule
    num_saved: int
    params: list[tuple[str, nn.Parameter]]


def capture(model: nn.Module, *inputs: torch.Tensor) -> Captured:
    """The forward and backward graphs of model(*inputs); the first placeholders are its parameters."""
    traced = fx.symbolic_trace(model)
    seen: dict[str, fx.GraphModule] = {}
    state = {}

    def compiler(kind):
        def compile(gm, example_inputs):
            seen[kind] = copy.deepcopy(gm)
            return make_boxed_func(gm.forward)
        return compile

    def partition(joint, joint_inputs, **kwargs):
        kwargs["static_lifetime_input_indices"] = list(range(len(list(model.parameters()))))  # as dynamo marks them
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        state["saved"] = sum(1 for n in bw.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents"))
        return fw, bw

    compiled = aot_module_simplified(traced, list(inputs), fw_compiler=compiler(FORWARD),
                                     bw_compiler=compiler(BACKWARD), partition_fn=partition)
    out = compiled(*inputs)
    out[0].sum().backward()
    return Captured(model, list(inputs), seen[FORWARD], seen[BACKWARD], state["saved"],
                    list(model.named_parameters()))


def unit_tables(model: nn.Module) -> tuple[dict[int, UnitSlot], dict[int, ParamSlot]]:
    """One unit per module with parameters (as dszero builds them), flat weights padded to 4 elements."""
    units, slots = {}, {}
    key = 0
    for module in model.modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        offset = 0
        for name, param in own:
            slots[id(param)] = ParamSlot(len(slots), name, tuple(param.shape), len(units), offset)
            offset += param.numel()
        units[len(units)] = UnitSlot(len(units), -(-offset // 4) * 4, own[0][1].dtype)
        key += 1
    return units, slots


def infos(captured: Captured, runtime_id: int, stage: int = 3, **extra) -> tuple[GraphInfo, GraphInfo]:
    units, by_param = unit_tables(captured.model)
    params = [p for _, p in captured.params]
    fw_inputs = [n for n in captured.forward.graph.nodes if n.op == "placeholder"]
    slots = {fw_inputs[i].name: by_param[id(p)] for i, p in enumerate(params)}
    if stage != 3:
        slots = {name: ParamSlot(s.key, s.name, s.shape) for name, s in slots.items()}
    positions = {i: slots[fw_inputs[i].name] for i in range(len(params))}
    forward = GraphInfo(FORWARD, runtime_id, stage, graph_id=0, params=dict(slots), units=units, **extra)
    bw_names = {n.name for n in captured.backward.graph.nodes if n.op == "placeholder"}
    backward = GraphInfo(BACKWARD, runtime_id, stage, graph_id=1, units=units,
                         params={k: v for k, v in slots.items() if k in bw_names}, grad_outputs=positions, **extra)
    return forward, backward


@dataclass
class LocalRuntime:
    """Serves the ops from the model's own tensors: a gather returns the unit's flat weights, a reduce
    records the gradient. What it saw is counted, so tests check what the graphs asked for."""

    model: nn.Module
    calls: list[tuple[str, int]] = field(default_factory=list)
    grads: dict[int, torch.Tensor] = field(default_factory=dict)
    live: int = 0
    peak_live: int = 0
    ahead: int = 0
    peak_ahead: int = 0
    profiling: bool = False

    def __post_init__(self):
        self.units, self.by_param = unit_tables(self.model)
        self.params = [p for _, p in self.model.named_parameters()]
        self.id = ops.register_runtime(self)
        self.flat = {}
        for module in self.model.modules():
            own = [p for p in module.parameters(recurse=False)]
            if own:
                unit = self.by_param[id(own[0])].unit
                flat = torch.cat([p.detach().reshape(-1) for p in own])
                self.flat[unit] = torch.nn.functional.pad(flat, (0, self.units[unit].numel - flat.numel()))

    def op_gather(self, unit, numel, dtype, device):
        self.calls.append(("gather", unit))
        self.peak_ahead = max(self.peak_ahead, self.ahead)  # others in flight while this one starts
        self.live += numel * dtype.itemsize
        self.ahead += numel * dtype.itemsize
        self.peak_live = max(self.peak_live, self.live)
        return self.flat[unit].clone()

    def op_wait_gather(self, unit, buffer):
        self.calls.append(("wait", unit))
        self.ahead -= buffer.numel() * buffer.element_size()
        self.peak_ahead = max(self.peak_ahead, self.ahead)  # others in flight while this one is used

    def op_release(self, unit, buffer):
        self.calls.append(("release", unit))
        self.live -= buffer.numel() * buffer.element_size()

    def op_reduce_grad(self, key, grad):
        self.calls.append(("reduce", key))
        self.grads[key] = grad.clone()

    def op_free_tensors(self, tensors):
        self.calls.append(("free", len(tensors)))
        for tensor in tensors:
            tensor.untyped_storage().resize_(0)

    def op_offload_tensor(self, key, tensor):
        self.calls.append(("offload", key))
        return tensor.to("cpu", copy=True)

    def op_reload_tensor(self, key, tensor):
        self.calls.append(("reload", key))
        return tensor.clone()

    def op_offload_states(self):
        self.calls.append(("offload_states", 0))

    def op_reload_states(self):
        self.calls.append(("reload_states", 0))

    def op_offload_param(self, unit):
        self.calls.append(("offload_param", unit))

    def op_reload_param(self, unit):
        self.calls.append(("reload_param", unit))

    def op_record_inputs(self, graph, tensors):
        self.calls.append(("record", graph))

    def count(self, what: str) -> int:
        return sum(1 for name, _ in self.calls if name == what)


def hollow_like(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of `tensor`'s shape holding no memory: what a partitioned parameter is while graphs run."""
    hollow = torch.empty_like(tensor)
    hollow.untyped_storage().resize_(0)
    return hollow


def run_pair(captured: Captured, forward: fx.Graph, backward: fx.Graph, hollow: bool = True):
    """Run rewritten forward and backward graphs as AOT autograd would: forward on (params, inputs), backward on
    (saved, ones as the output gradient). Returns (forward outputs, backward outputs)."""
    params = [p.detach() for _, p in captured.params]
    fw_args = [hollow_like(p) if hollow else p for p in params] + captured.inputs
    fw = fx.GraphModule({}, forward)
    outs = fw(*fw_args)
    num_user = len(outs) - captured.num_saved
    saved = list(outs[num_user:])
    tangents = [torch.ones_like(o) for o in outs[:num_user]]
    bw = fx.GraphModule({}, backward)
    grads = bw(*saved, *tangents)
    return outs[:num_user], grads


def reference(captured: Captured):
    params = [p.detach() for _, p in captured.params]
    outs = fx.GraphModule({}, copy.deepcopy(captured.forward.graph))(*params, *captured.inputs)
    num_user = len(outs) - captured.num_saved
    grads = fx.GraphModule({}, copy.deepcopy(captured.backward.graph))(*outs[num_user:],
                                                                         *[torch.ones_like(o) for o in outs[:num_user]])
    return outs[:num_user], grads
