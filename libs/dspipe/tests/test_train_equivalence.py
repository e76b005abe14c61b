"""Every schedule trains exactly as one process would: losses, each step's averaged gradients and the
parameters after AdamW steps equal (float64) an unpipelined run of the same layers, on gloo ranks.

One run_ranks call covers several schedules (a fresh module each); the reference runs in this process.
"""

import re

import pipe_models as pm
import pytest
import torch

import dscomm
from dscomm.testing import run_ranks
from dspipe import PipelineError

STEPS = 2
ALL = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev")


def train_each(rank, world, pipe, cases, layers_name, data_name=None, extra=None):
    dims = dscomm.ParallelDims(world, pipe=pipe)
    groups = dims.build()
    results = []
    for schedule, micro in cases:
        module = pm.build(getattr(pm, layers_name)(), pipe, schedule, dims=dims, **(extra or {}))
        data = getattr(pm, data_name) if data_name else None
        got = pm.train_pipelined(groups, module, schedule, STEPS, micro, data)
        results.append((schedule, micro, module.stage_id, got))
    return results


def check(results_by_rank, layers_name, replicas, data_name=None, extra=None):
    references = {}
    seen = set()
    for rank_results in results_by_rank:
        for schedule, micro, pipe_rank, got in rank_results:
            if micro not in references:
                references[micro] = pm.train_reference(getattr(pm, layers_name)(), STEPS, micro, replicas,
                                                       getattr(pm, data_name) if data_name else None, **(extra or {}))
            pm.assert_matches(got, references[micro], True, f"{schedule} m={micro} pipeline rank {pipe_rank}")
            seen.add((schedule, micro))
    return seen


def test_every_schedule_equals_one_process_on_2_stages():
    cases = [(s, 4) for s in ALL]
    results = run_ranks(train_each, 2, 2, cases, "mlp_layers", timeout=240)
    assert check(results, "mlp_layers", 1) == set(cases)


def test_4_stages_with_fewer_micro_batches_than_stages_and_a_count_not_a_multiple_of_them():
    cases = [("1f1b", 2), ("gpipe", 2), ("zb_h1", 2), ("zbv", 2), ("interleaved_1f1b", 2),
             ("1f1b", 6), ("zb_h1", 6), ("interleaved_1f1b", 6), ("zbv", 6), ("dualpipev", 9)]
    results = run_ranks(train_each, 4, 4, cases, "mlp_layers", timeout=300)
    assert check(results, "mlp_layers", 1) == set(cases)


def test_pipe_2_x_data_2_with_and_without_tied_embeddings():
    mlp = [("1f1b", 4), ("zb_h1", 3), ("dualpipev", 4)]
    results = run_ranks(train_each, 4, 2, mlp, "mlp_layers", timeout=240)
    assert check(results, "mlp_layers", 2) == set(mlp)
    # An embedding tied to the output projection: on two ranks (loop), on one rank (V, rank 0 holds both ends).
    tied = [("1f1b", 4), ("zb_h1", 4), ("zbv", 4)]
    extra = {"loss_fn": pm.token_loss}
    results = run_ranks(train_each, 4, 2, tied, "tied_layers", "token_batch", extra, timeout=240)
    assert check(results, "tied_layers", 2, "token_batch", extra) == set(tied)


def test_variable_sequence_lengths_with_dynamic_shape_and_activation_checkpointing():
    cases = [("1f1b", 4), ("zb_h1", 4), ("dualpipev", 4)]
    extra = {"dynamic_shape": True}
    results = run_ranks(train_each, 2, 2, cases, "mlp_layers", "varying_seq", extra, timeout=240)
    assert check(results, "mlp_layers", 1, "varying_seq", extra) == set(cases)
    extra = {"activation_checkpoint_interval": 3}
    results = run_ranks(train_each, 2, 2, cases, "mlp_layers", None, extra, timeout=240)
    assert check(results, "mlp_layers", 1, None, extra) == set(cases)


def changed_shape_rank(rank, world):
    dims = dscomm.ParallelDims(world, pipe=2)
    groups = dims.build()
    module = pm.build(pm.mlp_layers(), 2, "1f1b", dims=dims)
    try:
        pm.train_pipelined(groups, module, "1f1b", 2, 2, pm.varying_seq)
    except PipelineError as exc:
        return str(exc)
    return None


def test_a_shape_change_without_dynamic_shape_is_a_clear_error():
    first, second = run_ranks(changed_shape_rank, 2, timeout=120, pg_timeout=15)
    assert "action 0SEND_F1: stage 0's output for micro-batch 1 is float64[3, 4, 6], but the shapes exchanged " \
           "with pipeline rank 1 were float64[3, 3, 6]" in first and "dynamic_shape=True" in first
    # Stage 0 fails at its second send; how far its first send got before it shut the groups down is a race,
    # so which of stage 1's actions gives up (a header, the activations, or its gradient's send) varies: each
    # names the rank, the action and the peer.
    assert re.search(r"^rank 1 \(pipeline rank 1\), action 1(RECV_F[01]|SEND_B0) gave up waiting for .+ "
                     r"with pipeline rank 0 \(global rank 0\) within 15 s: that stage died", second), second


def eval_rank(rank, world, schedule):
    dims = dscomm.ParallelDims(world, pipe=2)
    groups = dims.build()
    module = pm.build(pm.mlp_layers(), 2, schedule, dims=dims)
    from dspipe.runtime import PipelineRuntime

    runtime = PipelineRuntime(module, groups, schedule)
    data = [pm.batch(0, groups.rank_in("data"), m) for m in range(4)]
    mean = runtime.eval_batch(iter(data), 4).item()
    per_micro = runtime.eval_batch(iter(data), 4, reduce_output=None)
    loss, logits = runtime.eval_batch(iter(data), 4, return_logits=True)
    grads = [p.grad for p in module.parameters()]
    module.float()  # the mean comes back in the losses' dtype on every rank, as DeepSpeed's does
    runtime.reset_activation_shape()
    single = runtime.eval_batch(iter([tuple(t.float() for t in b) for b in data]), 4)
    return mean, per_micro, logits, loss.item(), grads, (loss.dtype, single.dtype, single.item())


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipev"])
def test_eval_batch_returns_the_mean_loss_on_every_rank(schedule):
    reference = pm.build(pm.mlp_layers(), None, "1f1b", dims=dscomm.ParallelDims(1))
    with torch.no_grad():
        want = [pm.mse(reference(x), y) for x, y in (pm.batch(0, 0, m) for m in range(4))]
        last_logits = reference(pm.batch(0, 0, 3)[0])
    results = run_ranks(eval_rank, 2, schedule, timeout=120)
    loss_rank = 0 if schedule == "dualpipev" else 1
    for rank, (mean, per_micro, logits, loss, grads, dtypes) in enumerate(results):
        assert mean == pytest.approx(sum(w.item() for w in want) / 4, rel=1e-12)
        assert dtypes[:2] == (torch.float64, torch.float32) and dtypes[2] == pytest.approx(mean, rel=1e-5)
        assert loss == mean
        assert all(g is None for g in grads)  # no backward ran
        if rank == loss_rank:
            torch.testing.assert_close(torch.stack(per_micro), torch.stack(want))
            torch.testing.assert_close(logits, last_logits)
        else:
            assert per_micro is None and logits is None
