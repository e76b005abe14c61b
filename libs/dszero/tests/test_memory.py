"""memory_report() against the ZeRO paper's per-rank model-state formula for each stage.

With Psi parameters, N ranks and K bytes of optimizer state per parameter (AdamW: 8 in fp32, plus
4 for fp32 master weights when the model is 16-bit): stage 0 holds P + G + K Psi, stage 1
P + G + K Psi / N, stage 2 P + (G + K) Psi / N, stage 3 (P + G + K) Psi / N, where P and G are the bytes of parameters and
gradients per element (4 in fp32, 2 in bf16).
"""

import pytest
import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

BUCKET = 4096


def report(rank, world, stage, dtype):
    model = make_model(d=64, layers=2).to(dtype)
    psi = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()),
                                ZeroConfig(stage=stage, reduce_bucket_size=BUCKET, stage3_param_persistence_threshold=0),
                                precision="fp32" if dtype == torch.float32 else "bf16")
    tokens = next(batches(1, 1, world, rank))[0]
    zero.backward(loss_of(model, tokens).float())
    zero.step()  # the optimizer state exists after the first step
    return psi, largest, zero.memory_report()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [2, 4])
def test_model_states_follow_the_zero_formula(world, stage, dtype):
    psi, largest, got = run_ranks(report, world, stage, dtype, timeout=120)[0]
    elem = 4 if dtype == torch.float32 else 2
    k = 8 if dtype == torch.float32 else 12
    expected = {0: (elem + elem + k) * psi,
                1: (elem + elem) * psi + k * psi / world,
                2: elem * psi + (elem + k) * psi / world,
                3: (elem + elem + k) * psi / world}[stage]
    model_states = got["parameters"] + got["gradients"] + got["master_weights"] + got["optimizer_state"]
    assert model_states == pytest.approx(expected, rel=0.10), got
    # Communication buffers: stage 1 one gradient shard; stage 2 one bucket (no overlap), which closes
    # at the first parameter that takes it past BUCKET elements.
    bound = {0: 0, 1: elem * psi / world * 1.1, 2: elem * (BUCKET + largest), 3: 0}[stage]  # stage 3: all released
    assert got["communication_buffers"] <= bound
