"""AutoEP at autoep_size 2 and 4 on 4 gloo ranks against autoep_size 1 in one process.

Each rank runs its own batch through its slice of the experts (tokens travel by the exact-split
all-to-all-v); dense gradients are averaged over the world, expert gradients summed over the
expert-data group and divided by the world (the scale ZeRO's "gradient_average_over" gives). The
reference runs every rank's batch through the whole model. Losses, router logits, gradients and
weights after SGD steps equal the reference's (float32; rtol 1e-4 for summation order), for tiny
Mixtral and DeepSeek-V3 (group-limited routing, correction bias, shared expert) and both backends.
"""

import copy

import autoep_models as M
import pytest
import torch

import dscomm
from dscomm.testing import run_ranks
from dsconfig import ExpertParallelConfig
from dsmoe import autoep, is_moe_param

pytest.importorskip("transformers")

WORLD, STEPS, LR = 4, 2, 0.1
CASES = [("mixtral", 2, "grouped_mm"), ("mixtral", 4, "loop"), ("deepseek_v3", 2, "loop"),
         ("deepseek_v3", 4, "grouped_mm")]


def _reduce(model, expert_data_group):
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        dscomm.all_reduce(param.grad, group=expert_data_group if is_moe_param(param) else None)
        param.grad.div_(WORLD)


def _slice(name, tensor, model):
    """The rows of a full expert tensor this rank's model holds (other tensors whole)."""
    for layer_name, layer in autoep.autoep_layers(model):
        if name.startswith(f"{layer_name}.{layer.names.experts}."):
            ids = layer.local_experts.global_expert_ids()
            return tensor[ids.start:ids.stop]
    return tensor


def _case(rank, kind, ep, backend):
    base = M.build(kind)
    reference = copy.deepcopy(base)
    autoep.apply(reference, ExpertParallelConfig(enabled=True), backend="loop")
    groups = dscomm.ParallelDims(WORLD, expert=ep).build()
    model = copy.deepcopy(base)
    autoep.apply(model, ExpertParallelConfig(enabled=True, autoep_size=ep), groups.expert, backend=backend)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    worst = {"loss": 0.0, "logits": 0.0, "grad": 0.0, "param": 0.0}

    def err(a, b):
        return float((a - b).abs().max() / (b.abs().max() + 1e-6))

    for step in range(STEPS):
        ref_loss = ref_logits = None
        for r in range(WORLD):
            out = reference(**M.batch(100 * step + r))
            (out.loss / WORLD).backward()
            if r == rank:
                ref_loss, ref_logits = out.loss.detach(), [t.detach() for t in out.router_logits]
        out = model(**M.batch(100 * step + rank))
        out.loss.backward()
        _reduce(model, groups.expert_data)
        worst["loss"] = max(worst["loss"], err(out.loss.detach(), ref_loss))
        worst["logits"] = max(worst["logits"], *(err(a.detach(), b) for a, b in zip(out.router_logits, ref_logits)))
        ref_params = dict(reference.named_parameters())
        for name, param in model.named_parameters():
            want = _slice(name, ref_params[name].grad, model)
            worst["grad"] = max(worst["grad"], float((param.grad - want).abs().max() / (want.abs().max() + 1e-6)))
        ref_opt.step()
        opt.step()
        ref_opt.zero_grad()
        opt.zero_grad()
    ref_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        want = _slice(name, ref_params[name].detach(), model)
        worst["param"] = max(worst["param"], float((param.detach() - want).abs().max()))
    layer = autoep.autoep_layers(model)[0][1]
    return worst, list(layer.local_experts.global_expert_ids()), tuple(layer.local_experts.gate_up_proj.shape)


def _ranks_main(rank, world):
    return [_case(rank, *case) for case in CASES]


def test_autoep_sizes_equal_one_process():
    results = run_ranks(_ranks_main, WORLD, timeout=240)
    for index, (kind, ep, backend) in enumerate(CASES):
        experts = 4 if kind == "mixtral" else 8
        per_rank = experts // ep
        for rank, per_case in enumerate(results):
            worst, ids, shape = per_case[index]
            where = f"{kind} ep {ep} {backend} rank {rank}: {worst}"
            assert worst["loss"] < 1e-5 and worst["logits"] < 1e-5, where
            assert worst["grad"] < 1e-4 and worst["param"] < 1e-5, where
            first = (rank % ep) * per_rank
            assert ids == list(range(first, first + per_rank)) and shape[0] == per_rank, where


def _replicated(rank, world, kind, score_apply):
    """Ranks that hold the same tokens (a tensor-parallel group) split the experts without exchanging any:
    each computes its experts' share of every token, the shares summed over the group. Every rank sees the
    whole batch's loss and gradients, as one process holding every expert does."""
    base = M.build(kind)
    reference = copy.deepcopy(base)
    autoep.apply(reference, ExpertParallelConfig(enabled=True, score_apply=score_apply), backend="loop")
    group = dscomm.ParallelDims(world, expert=world).build().expert
    model = copy.deepcopy(base)
    autoep.apply(model, ExpertParallelConfig(enabled=True, autoep_size=world, score_apply=score_apply), group,
                 backend="loop", replicated_tokens=True)
    ref_opt, opt = torch.optim.SGD(reference.parameters(), lr=LR), torch.optim.SGD(model.parameters(), lr=LR)
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    for step in range(STEPS):
        batch = M.batch(100 * step)  # the same tokens on every rank
        ref_loss = reference(**batch).loss
        ref_loss.backward()
        loss = model(**batch).loss
        loss.backward()
        worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()))
        ref_params = dict(reference.named_parameters())
        for name, param in model.named_parameters():  # no reduction: every rank's gradients are already whole
            want = _slice(name, ref_params[name].grad, model)
            worst["grad"] = max(worst["grad"], float((param.grad - want).abs().max() / (want.abs().max() + 1e-6)))
        ref_opt.step()
        opt.step()
        ref_opt.zero_grad()
        opt.zero_grad()
    ref_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        worst["param"] = max(worst["param"], float((param.detach() - _slice(name, ref_params[name], model)).abs().max()))
    layer = autoep.autoep_layers(model)[0][1]
    return worst, list(layer.local_experts.global_expert_ids()), layer.replicated_tokens


@pytest.mark.parametrize(("kind", "score_apply"), [("mixtral", "post"), ("deepseek_v3", "pre")])
def test_experts_over_ranks_holding_the_same_tokens_equal_one_process(kind, score_apply):
    experts = 4 if kind == "mixtral" else 8
    for rank, (worst, ids, replicated) in enumerate(run_ranks(_replicated, 2, kind, score_apply, timeout=240)):
        assert replicated and ids == list(range(rank * experts // 2, (rank + 1) * experts // 2)), rank
        assert worst["loss"] < 1e-5 and worst["grad"] < 1e-4 and worst["param"] < 1e-5, (kind, rank, worst)
