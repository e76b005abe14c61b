"""Muon and Lamb at ZeRO stages 1-3 (dszero's whole-tensor step) equal stage 0 on one rank, in float64.

Muon (both ns methods, per-head on one matrix, embeddings on the Adam half with adam_lr) at stages 1, 2
and 3 on 2 and 4 gloo ranks: parameters after 10 steps equal one rank at stage 0, and each Muon matrix
was orthogonalised by exactly one rank. Lamb (with max_grad_norm) at stages 1 and 2 likewise, with the
same trust ratios. Checkpoints resume bit-identically at the same size and reload at 1 and 4 ranks;
stage 3 with NVMe optimizer offload and save_muon_momentum_buffer_in_memory trains the same.
"""

import pytest
import torch
from engine_models import make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import OffloadOptimizerConfig, ZeroConfig
from dstrain.ops import Lamb, Muon
from dstrain.ops.muon_params import select_muon_parameters

STEPS, GLOBAL_BATCH, SEQ, VOCAB = 10, 8, 12, 48
PER_HEAD = "layers.0.1.weight"  # [48, 24]: orthogonalised as 4 heads of 12 rows


def batch(step, world, rank):
    gen = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=gen)
    return tokens.chunk(world)[rank]


def muon(model, ns_method):
    select_muon_parameters(model)
    dict(model.named_parameters())[PER_HEAD].muon_num_heads = 4
    return Muon(model.parameters(), lr=0.02, momentum=0.9, weight_decay=0.01, adam_lr=0.003, ns_method=ns_method,
                per_head_muon=True)


def lamb(model, _=None):
    return Lamb(model.parameters(), lr=0.01, weight_decay=0.01, max_grad_norm=0.5)


OPTIMIZERS = {"muon": muon, "lamb": lamb}


def build(kind, stage, variant=None, config=None):
    model = make_model().double()
    optimizer = OPTIMIZERS[kind](model, variant)
    zero = dszero.ZeroOptimizer(model, optimizer, config or ZeroConfig(stage=stage, reduce_bucket_size=300),
                                precision="fp64")
    return model, optimizer, zero


def train(model, zero, world, rank, steps=range(STEPS)):
    for step in steps:
        zero.backward(model(batch(step, world, rank)))
        zero.step()
        zero.zero_grad()


def full_params(model):
    with dszero.GatheredParameters(list(model.parameters())):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def run_stages(rank, world, runs):
    results = {}
    for kind, stage, variant in runs:
        model, optimizer, zero = build(kind, stage, variant)
        train(model, zero, world, rank)
        coeffs = optimizer.get_lamb_coeffs() if kind == "lamb" else None
        results[(kind, stage, variant)] = (full_params(model), list(zero.tensor_shards.transformed), coeffs)
    return results


MUON_RUNS = [("muon", stage, ns) for ns in ("gram", "standard") for stage in (1, 2, 3)]
LAMB_RUNS = [("lamb", stage, None) for stage in (1, 2)]


@pytest.fixture(scope="module")
def on_one_rank():
    runs = [("muon", 0, "gram"), ("muon", 0, "standard"), ("lamb", 0, None)]
    (results,) = run_ranks(run_stages, 1, runs)
    return results


def assert_params_equal(got, expected, what):
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-9, atol=1e-12, msg=f"{what}: {name}")


@pytest.mark.parametrize("world", [2, 4])
def test_muon_and_lamb_at_stages_1_to_3_equal_stage_0_on_one_rank(on_one_rank, world):
    per_rank = run_ranks(run_stages, world, MUON_RUNS + LAMB_RUNS, timeout=240)
    model = make_model()
    select_muon_parameters(model)
    matrices = sorted(n for n, p in model.named_parameters() if p.use_muon)
    assert "embed.weight" not in matrices and "layers.0.1.weight" in matrices
    for kind, stage, variant in MUON_RUNS + LAMB_RUNS:
        expected, _, coeffs = on_one_rank[(kind, 0, variant)]
        for result in per_rank:
            assert_params_equal(result[(kind, stage, variant)][0], expected, f"{kind} stage {stage} {variant}")
        if kind == "muon":  # every matrix orthogonalised once, by one rank
            assert sorted(n for r in per_rank for n in r[(kind, stage, variant)][1]) == matrices
        else:
            torch.testing.assert_close(torch.tensor(per_rank[0][(kind, stage, variant)][2]), torch.tensor(coeffs),
                                       rtol=1e-9, atol=0)


# ---------------------------------------------------------------------------------------------- checkpoints
def save_then_continue(rank, world, directory, stage):
    finals = {}
    for kind in OPTIMIZERS:
        model, _, zero = build(kind, stage, "gram")
        train(model, zero, world, rank, range(5))
        zero.save(f"{directory}/{kind}")
        train(model, zero, world, rank, range(5, STEPS))
        finals[kind] = full_params(model)
    return finals


def load_then_continue(rank, world, directory, stage):
    finals = {}
    for kind in OPTIMIZERS:
        model, _, zero = build(kind, stage, "gram")
        zero.load(f"{directory}/{kind}")
        train(model, zero, world, rank, range(5, STEPS))
        finals[kind] = full_params(model)
    return finals


@pytest.mark.parametrize("stage, reloads", [(2, [(4, 1), (1, 2)]), (3, [(4, 3)])])
def test_checkpoints_resume_bit_identically_and_reload_at_another_size(tmp_path, stage, reloads):
    (uninterrupted, _) = run_ranks(save_then_continue, 2, str(tmp_path), stage, timeout=180)
    (resumed, _) = run_ranks(load_then_continue, 2, str(tmp_path), stage, timeout=180)
    for kind in OPTIMIZERS:
        for name, value in uninterrupted[kind].items():
            assert torch.equal(resumed[kind][name], value), (kind, name)  # bit for bit
    for world, new_stage in reloads:
        resharded = run_ranks(load_then_continue, world, str(tmp_path), new_stage, timeout=180)[0]
        for kind in OPTIMIZERS:
            assert_params_equal(resharded[kind], uninterrupted[kind], f"{kind} at {world} rank(s), stage {new_stage}")


# ---------------------------------------------------------------------------------------------- NVMe offload
def nvme_rank(rank, world, root):
    offload = OffloadOptimizerConfig(device="nvme", nvme_path=root, buffer_count=4, pin_memory=False)
    config = ZeroConfig(stage=3, offload_optimizer=offload, sub_group_size=3000,
                        save_muon_momentum_buffer_in_memory=True)
    model, _, zero = build("muon", 3, "gram", config)
    train(model, zero, world, rank)
    swapped = {k for sub in zero.stepper.subgroups for k in sub.regions}
    return full_params(model), swapped


def test_muon_at_stage_3_with_nvme_offload_keeps_its_momentum_in_memory(tmp_path, on_one_rank):
    for params, swapped in run_ranks(nvme_rank, 2, str(tmp_path), timeout=180):
        assert_params_equal(params, on_one_rank[("muon", 0, "gram")][0], "stage 3 + NVMe")
        assert "momentum_buffer" not in swapped and {"exp_avg", "exp_avg_sq"} <= swapped  # the Adam half swaps


def train_partially_frozen(rank, world, stage):
    model = make_model().double()
    select_muon_parameters(model)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if p.ndim >= 2}
    for name, param in model.named_parameters():
        param.requires_grad = name not in frozen  # every Muon matrix frozen: only the Adam half trains
    optimizer = Muon(model.parameters(), lr=0.02, adam_lr=0.003)
    zero = dszero.ZeroOptimizer(model, optimizer, ZeroConfig(stage=stage), precision="fp64")
    train(model, zero, world, rank, steps=range(2))
    params = full_params(model)
    return [g["use_muon"] for g in optimizer.param_groups], {n: params[n] for n in frozen}, frozen


@pytest.mark.parametrize("stage", [2, 3])
def test_muon_with_every_matrix_frozen_trains_the_rest(stage):
    # DeepSpeed's partial-training case (ops/muon/test_muon_partial_training.py): the empty Muon half is dropped.
    for use_muon, after, before in run_ranks(train_partially_frozen, 2, stage):
        assert use_muon == [False]
        for name, value in before.items():
            torch.testing.assert_close(after[name], value, rtol=0, atol=0, msg=name)
