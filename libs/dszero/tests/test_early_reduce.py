"""Stage 1 reduces its gradients during the step's last backward pass (early_reduce.py), with the
results of a reduction at the step: the same weights as stage 0, bit for bit at 2 ranks."""

import torch
import torch.distributed as dist
from models import batches, loss_of, make_model

import dscomm
import dszero
from dscomm.logger import LOGGER
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

EARLY, AT_STEP = "zero_reduce_grads_in_backward", "zero_reduce_scatter_grads"


def reductions() -> set[str]:
    dist.barrier()  # every async op has completed and logged itself
    names = {r.name for r in LOGGER.records} & {EARLY, AT_STEP}
    LOGGER.reset()
    return names


def train_both(rank, world):
    dscomm.configure(enabled=True, prof_all=True)
    runs = {}
    for stage in (0, 1):
        model = make_model()
        zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                    ZeroConfig(stage=stage, reduce_bucket_size=2000))
        seen, launched_after_backward = [], []
        # Steps: 1 micro-step; 2 micro-steps (the first is expected last: dropped, reduced at the step);
        # 2 again (now the second launches); gradient sync off; rank 0 drops a gradient after backward.
        plan = [(1, True, False), (2, True, False), (2, True, False), (1, False, False), (1, True, True)]
        for (micro, sync, drop), micro_batches in zip(plan, batches(len(plan), 2, world, rank)):
            zero.require_gradient_sync(sync)
            LOGGER.reset()
            for tokens in micro_batches[:micro]:
                zero.backward(loss_of(model, tokens) / micro)
            if stage == 1:
                launched_after_backward.append(zero.reducer.early.launched)
            if drop and rank == 0:
                model.head.bias.grad = None  # only on rank 0: the ranks must still agree to reduce at the step
            assert zero.step()
            zero.zero_grad()
            seen.append(reductions())
        runs[stage] = ([p.detach().clone() for p in model.parameters()], seen, launched_after_backward,
                       len(zero.reducer.early.buckets) if stage == 1 else 0)
    return runs


def test_stage1_reduces_during_backward_with_stage0s_results():
    for runs in run_ranks(train_both, 2, timeout=120):
        weights0, _, _, _ = runs[0]
        weights1, seen, launched, buckets = runs[1]
        assert buckets > 2  # the tiny model is cut into several buckets
        assert launched == [buckets, buckets, buckets, 0, buckets]  # all launched by the end of backward
        assert seen == [{EARLY}, {EARLY, AT_STEP}, {EARLY}, {AT_STEP}, {EARLY, AT_STEP}]
        for a, b in zip(weights0, weights1):
            assert torch.equal(a, b)
