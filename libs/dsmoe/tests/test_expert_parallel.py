"""Expert parallelism on 4 gloo ranks against one process holding every expert.

Each rank routes its own tokens, sends them to the ranks holding their experts and gets the outputs
back; gradients of the dense weights are averaged over the world, those of the experts summed over
their expert-data-parallel group and divided by the world (the scale ZeRO uses through
"gradient_average_over"). At ep_size 1, 2 and 4, with dense and sparse dispatch, top-1/2/3, with and
without dropping tokens, outputs, gradients and weights after SGD steps equal the one-process model
that runs every rank's batch (float64; the gate is float32 as DeepSpeed's).
"""

import torch
import torch.distributed as dist
from moe_models import HIDDEN, distinct_experts, mlp
from torch import nn

import dscomm
from dscomm.testing import run_ranks
from dsmoe import MoE, MoEError, all_to_all, is_moe_param

WORLD, STEPS, TOKENS, LR = 4, 3, 12, 0.2

# (ep_size, dispatch, drop_tokens, k, how the layer gets its groups, residual)
CONFIGS = [
    (1, "sparse", True, 1, "dims", False),
    (2, "dense", True, 1, "dims", False),
    (2, "sparse", False, 2, "getters", False),
    (4, "sparse", True, 2, "getters", True),
    (4, "dense", False, 1, "dims", False),
    (2, "sparse", True, 3, "dims", False),
]


def build(ep, dispatch, drop, k, residual):
    torch.manual_seed(0)
    pre = nn.Linear(HIDDEN, HIDDEN)
    layer = MoE(HIDDEN, mlp(), num_experts=4, ep_size=ep, k=k, capacity_factor=0.75, min_capacity=0,
                drop_tokens=drop, use_residual=residual, dispatch=dispatch)
    return nn.ModuleDict({"pre": pre, "moe": layer}).double()


def batch(step, rank):
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(100 * step + rank), dtype=torch.float64)


def forward(model, x, step, rank):
    model["moe"].deepspeed_moe.gate.generator = torch.Generator().manual_seed(1000 * step + rank)
    out, l_aux, _ = model["moe"](torch.tanh(model["pre"](x)))
    return out, out.pow(2).mean() + 0.1 * l_aux


def reference_step(model, opt, step, rank):
    """One step over every rank's batch; returns this rank's output and the gradients by name."""
    mine = None
    for r in range(WORLD):
        out, loss = forward(model, batch(step, r), step, r)
        (loss / WORLD).backward()
        if r == rank:
            mine = out.detach()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    opt.zero_grad()
    return mine, grads


def reduce_gradients(model, expert_data_group):
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        if is_moe_param(param):
            dscomm.all_reduce(param.grad, group=expert_data_group)
        else:
            dscomm.all_reduce(param.grad)
        param.grad.div_(WORLD)  # experts too: the same scale at every ep_size


def worst(a, b):
    return float(((a - b).abs() / (b.abs() + 1e-6)).max())


def check_config(rank, ep, dispatch, drop, k, how, residual):
    reference = build(1, dispatch, drop, k, residual)
    distinct_experts(reference["moe"])
    model = build(ep, dispatch, drop, k, residual)
    if how == "dims":
        groups = dscomm.ParallelDims(WORLD, expert=ep).build()
        model["moe"].set_expert_groups(groups.expert, groups.expert_data)
    else:
        model["moe"].set_deepspeed_parallelism()
    group = model["moe"].expert_data_group
    state = reference.state_dict()
    model.load_state_dict({name: state[name] for name in model.state_dict()})  # experts by global name
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    errors = {"out": 0.0, "grad": 0.0, "param": 0.0}
    for step in range(STEPS):
        ref_out, ref_grads = reference_step(reference, ref_opt, step, rank)
        out, loss = forward(model, batch(step, rank), step, rank)
        loss.backward()
        reduce_gradients(model, group)
        errors["out"] = max(errors["out"], worst(out.detach(), ref_out))
        for name, param in model.named_parameters():
            want = ref_grads.get(name, torch.zeros_like(param))
            errors["grad"] = max(errors["grad"], float((param.grad - want).abs().max()))
        opt.step()
        opt.zero_grad()
    ref_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        errors["param"] = max(errors["param"], float((param.detach() - ref_params[name].detach()).abs().max()))
    return errors, model["moe"].global_expert_ids()


def variable_all_to_all(rank, world):
    """Rank r sends j + r + 1 rows to rank j; the gradient goes back the same way."""
    send = [j + rank + 1 for j in range(world)]
    recv = [rank + i + 1 for i in range(world)]
    rows = torch.cat([torch.full((n, 2), float(100 * rank + j)) for j, n in enumerate(send)]).requires_grad_(True)
    out = all_to_all(rows, dist.group.WORLD, recv, send)
    expected = torch.cat([torch.full((n, 2), float(100 * i + rank)) for i, n in enumerate(recv)])
    (out * torch.arange(out.shape[0], dtype=out.dtype).unsqueeze(1)).sum().backward()
    # the gradient of each sent row is its position in the receiving rank's buffer: rank j puts the
    # rows from rank r after those of ranks 0..r-1, which sent it j + i + 1 rows each
    grads = [rows.grad[sum(send[:j]):sum(send[:j + 1]), 0].tolist() for j in range(world)]
    offsets = [sum(j + i + 1 for i in range(rank)) for j in range(world)]
    positions = [[float(p) for p in range(offsets[j], offsets[j] + send[j])] for j in range(world)]
    return torch.equal(out.detach(), expected), positions == grads


def ranks_main(rank, world):
    results = {"configs": [check_config(rank, *config) for config in CONFIGS],
               "all_to_all": variable_all_to_all(rank, world)}
    too_big = MoE(HIDDEN, mlp(), num_experts=8, ep_size=8)
    try:
        too_big.set_deepspeed_parallelism()
        results["refused"] = None
    except MoEError as exc:
        results["refused"] = str(exc)
    return results


def test_expert_parallel_sizes_equal_one_process():
    results = run_ranks(ranks_main, WORLD, timeout=240)
    for rank, result in enumerate(results):
        for config, (errors, ids) in zip(CONFIGS, result["configs"], strict=True):
            assert errors["out"] < 1e-6 and errors["grad"] < 1e-7 and errors["param"] < 1e-7, (rank, config, errors)
            ep = config[0]
            local = 4 // ep
            assert ids == list(range(rank % ep * local, rank % ep * local + local)), (rank, config, ids)
        assert result["all_to_all"] == (True, True), rank
        assert "ep_size 8 does not divide the 4 data-parallel rank(s)" in result["refused"]
        assert "valid ep_size values here: [1, 2, 4]" in result["refused"]
