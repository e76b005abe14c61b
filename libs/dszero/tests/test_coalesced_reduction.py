"""ZeroOptimizer.coalesced_reduction(): the backward passes of one block accumulate locally and are reduced once
at its end (DeepSpeed's engine.coalesce_grad_reduction), giving the step the same gradients as reducing each
backward; stage 3, which keeps no full gradients, reduce-scatters each backward as usual inside the block."""

import contextlib

import pytest
import torch

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

MICRO_STEPS = 4


def _train(rank, world, stage, coalesce, loss_scale_config=False):
    """The weights after two steps of MICRO_STEPS backward passes each, and the bucket reductions logged."""
    dscomm.configure(enabled=True, prof_all=True)
    dscomm.reset_comms_log()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)).double()
    zero = dszero.ZeroOptimizer(model, torch.optim.Adam(model.parameters(), lr=0.01),
                                ZeroConfig(stage=stage, reduce_bucket_size=20,
                                           stage3_param_persistence_threshold=0),
                                precision="fp64")
    generator = torch.Generator().manual_seed(100 + rank)
    for _step in range(2):
        with zero.coalesced_reduction() if coalesce else contextlib.nullcontext():
            for _ in range(MICRO_STEPS):
                x = torch.randn(3, 6, generator=generator, dtype=torch.float64)
                zero.backward(model(x).pow(2).sum())
        zero.step()
        zero.zero_grad()
    counts = {name: sum(entry["count"] for entry in sizes.values()) for name, sizes in dscomm.get_comms_log().items()}
    weights = [p.detach().clone() for p in model.parameters()] if stage < 3 else \
        [dszero.safe_get_full_fp32_param(p) for p in model.parameters()]
    return weights, counts


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_coalesced_block_trains_as_reducing_each_backward(stage):
    def both(rank, world):
        return _train(rank, world, stage, coalesce=False), _train(rank, world, stage, coalesce=True)

    for (ref, ref_counts), (got, got_counts) in run_ranks(both, 2, timeout=120):
        for a, b in zip(ref, got):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        if stage == 2:
            # Each backward launches every bucket; the block launches them once: a quarter of the reductions.
            assert got_counts["zero_reduce_bucket"] * MICRO_STEPS == ref_counts["zero_reduce_bucket"], \
                (ref_counts, got_counts)


def test_an_exception_inside_the_block_reduces_nothing_and_the_step_still_applies_everything():
    def run(rank, world):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4).double()
        zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=1.0), ZeroConfig(stage=2),
                                    precision="fp64")
        dscomm.configure(enabled=True, prof_all=True)
        dscomm.reset_comms_log()
        with pytest.raises(KeyError), zero.coalesced_reduction():
            zero.backward(model(torch.ones(1, 4, dtype=torch.float64)).sum())
            raise KeyError("a data error on this rank")
        reduced_in_block = len(dscomm.get_comms_log().get("zero_reduce_bucket", {}))
        assert zero.gradient_sync  # sync is back on
        zero.backward(model(torch.ones(1, 4, dtype=torch.float64)).sum())
        bias_grad = dszero.safe_get_full_grad(model.bias)
        return reduced_in_block, bias_grad.tolist()

    for reduced_in_block, bias_grad in run_ranks(run, 2, timeout=90):
        assert reduced_in_block == 0
        assert bias_grad == [2.0] * 4  # both backward passes, averaged over identical ranks

