"""ZeroOptimizer._get_norm_groups (DeepSpeed's name): each flat group's norm of the gradients the next step
applies (stage 2: one per param group; stage 3: one per unit, as DeepSpeed's sub-groups), the same on every
rank, seen again after a script clips them itself with safe_set_local_grad."""

import pytest
import torch
from models import loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def _batch(rank, world):
    tokens = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(3))  # one global batch
    return tokens.chunk(world)[rank]


def norms_around_a_custom_clip(rank, world, stage):
    torch.manual_seed(0)
    model = make_model()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=1e-2)
    zero = dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=stage, stage3_param_persistence_threshold=0))
    zero.backward(loss_of(model, _batch(rank, world)))
    before = [float(n) for n in zero._get_norm_groups()]
    whole = [[dszero.safe_get_full_grad(p) for p in group] for group in (decay, rest)]
    for param in model.parameters():
        dszero.safe_set_local_grad(param, torch.clamp(dszero.safe_get_local_grad(param), -1e-3, 1e-3))
    after = [float(n) for n in zero._get_norm_groups()]
    zero.step()
    return before, [float(torch.cat([g.reshape(-1) for g in group]).norm()) for group in whole], after, \
        zero._global_grad_norm, len(zero.groups)


def _combined(norms):
    return sum(n * n for n in norms) ** 0.5


@pytest.mark.parametrize("stage", [2, 3])
def test_the_norm_of_each_group_before_and_after_a_custom_clip(stage):
    results = run_ranks(norms_around_a_custom_clip, 2, stage, timeout=120)
    for before, whole, after, stepped, flat_groups in results:
        assert before == results[0][0] and len(before) == flat_groups  # one per flat group, the same on every rank
        if stage == 2:
            assert before == pytest.approx(whole, rel=1e-5)  # each param group's whole reduced gradients
        assert _combined(before) == pytest.approx(_combined(whole), rel=1e-5)
        assert all(a <= b for a, b in zip(after, before)) and _combined(after) < _combined(before)  # the clip is seen
        assert stepped == pytest.approx(_combined(after), rel=1e-5)  # what the step used


def stage1_refuses(rank, world):
    model = make_model()
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), ZeroConfig(stage=1))
    zero.backward(loss_of(model, _batch(rank, world)))
    try:
        zero._get_norm_groups()
    except dszero.ZeroError as exc:
        return str(exc)
    return ""


def test_below_stage_2_the_reduced_norm_before_the_step_is_refused_by_name():
    message = run_ranks(stage1_refuses, 2, timeout=120)[0]
    assert "stage 1" in message and "stage 2 or 3" in message and "get_global_grad_norm" in message
