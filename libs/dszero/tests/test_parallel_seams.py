"""The seams a pipeline, experts and tensor parallelism stand on, proven with a hand-split pipeline.

4 gloo ranks as pipe 2 x data 2 (dscomm.ParallelDims); a 4-layer float64 model split by hand into two
stages; a hand-written 1F1B schedule of 4 micro-batches driving one ZeroOptimizer per stage (stage 1
or 2) through the public controls: gradient sync held back and released, finish_backward(), the norm
decided over every rank. After 5 steps losses and parameters equal one process running the whole
model. Then an fp16 overflow on one stage skips the step on every rank, and an expert-like parameter
group partitioned over its own 2-rank group reduces over that group only (stages 0-3; at stage 3 it is also
gathered over it).
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

STEPS, MICRO, MICRO_BATCH, CLIP = 5, 4, 3, 0.05


def whole_model(dtype=torch.float64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def batch(step: int, replica: int, micro: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 10 * replica + micro)
    return torch.randn(MICRO_BATCH, 6, generator=gen, dtype=dtype), torch.randn(MICRO_BATCH, 3, generator=gen,
                                                                                  dtype=dtype)


def loss_fn(out, target):
    return ((out - target) ** 2).mean() / MICRO  # the step's loss is the mean over its micro-batches


def reference(stage_count: int = 2, data: int = 2) -> tuple[list[float], list[torch.Tensor]]:
    model = whole_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    losses = []
    for step in range(STEPS):
        total = 0.0
        for replica in range(data):
            for micro in range(MICRO):
                x, y = batch(step, replica, micro)
                loss = loss_fn(model(x), y) / data
                loss.backward()
                total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, [p.detach().clone() for p in model.parameters()]


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """("F", i) / ("B", i) in 1F1B order for `stage` (warm-up forwards, then alternate, then drain)."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    forward, backward = warmup, 0
    while backward < micro_batches:
        if forward < micro_batches:
            order.append(("F", forward))
            forward += 1
        order.append(("B", backward))
        backward += 1
    return order


def pipeline_rank(rank, world, zero_stage, precision="fp32", poison_step=None, sync_last_backward=True):
    groups = dscomm.ParallelDims(world, pipe=2).build()
    stage, replica = groups.stage, groups.rank_in("data")
    dtype = torch.float16 if precision == "fp16" else torch.float64
    whole = whole_model(dtype)
    module = whole[:4] if stage == 0 else whole[4:]  # stage 0: two layers; stage 1: two layers and the loss
    opt = torch.optim.AdamW(module.parameters(), lr=0.05, weight_decay=0.01)
    zero = dszero.ZeroOptimizer(module, opt, ZeroConfig(stage=zero_stage, reduce_bucket_size=200),
                                gradient_clipping=CLIP, group=groups.data, norm_group=groups.norm,
                                precision=dszero.Precision("fp16", initial_scale_power=4) if precision == "fp16"
                                else "fp64")
    peer = groups.next_stage_rank if stage == 0 else groups.prev_stage_rank
    losses, applied = [], []
    for step in range(STEPS):
        zero.require_gradient_sync(False)
        inputs, outputs, sends, step_loss = {}, {}, [], 0.0
        schedule = one_f_one_b(stage, 2, MICRO)
        for position, (kind, micro) in enumerate(schedule):
            if kind == "F":
                x, y = batch(step, replica, micro, dtype)
                if stage == 1:
                    x = torch.empty(MICRO_BATCH, 16, dtype=dtype)
                    dscomm.recv(x, src=peer)
                    x.requires_grad_(True)
                inputs[micro] = x
                out = module(x)
                if stage == 0:
                    sends.append(dscomm.isend(out.detach().contiguous(), dst=peer))
                    outputs[micro] = out
                else:
                    outputs[micro] = loss_fn(out, y)
                    step_loss += outputs[micro].item()
            else:
                if position == len(schedule) - 1 and sync_last_backward:
                    zero.require_gradient_sync(True)  # the last backward reduces as it runs
                if stage == 1:
                    loss = outputs.pop(micro)
                    if poison_step == step:
                        loss = loss * float("inf")
                    (loss * zero.backward_scale).backward()
                    sends.append(dscomm.isend(inputs.pop(micro).grad.contiguous(), dst=peer))
                else:
                    grad = torch.empty(MICRO_BATCH, 16, dtype=dtype)
                    dscomm.recv(grad, src=peer)
                    outputs.pop(micro).backward(grad)
        for handle in sends:
            handle.wait()
        zero.finish_backward()  # with sync still off: reduces everything accumulated, now
        zero.require_gradient_sync(True)
        applied.append(zero.step())
        zero.zero_grad()
        total = torch.tensor([step_loss], dtype=torch.float64)
        dscomm.all_reduce(total, group=groups.data)
        losses.append(total.item() / 2)
    params = [p.detach().clone() for p in module.parameters()] if zero_stage < 3 else []
    return stage, losses, params, applied, zero.skipped_steps, zero.loss_scale


@pytest.mark.parametrize(("zero_stage", "sync_last_backward"), [(1, True), (2, True), (2, False)],
                         ids=["stage1", "stage2-sync-on-last-backward", "stage2-finish-backward"])
def test_hand_split_1f1b_pipeline_with_zero_equals_one_process(zero_stage, sync_last_backward):
    expected_losses, expected_params = reference()
    results = run_ranks(pipeline_rank, 4, zero_stage, "fp32", None, sync_last_backward, timeout=180)
    for stage, losses, params, applied, _skipped, _scale in results:
        assert applied == [True] * STEPS
        if stage == 1:
            torch.testing.assert_close(losses, expected_losses, rtol=1e-10, atol=0)
        mine = expected_params[:4] if stage == 0 else expected_params[4:]
        for got, want in zip(params, mine, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_an_fp16_overflow_on_one_stage_skips_the_step_on_every_rank():
    results = run_ranks(pipeline_rank, 4, 2, "fp16", 2, timeout=180)
    for stage, _losses, _params, applied, skipped, _scale in results:
        assert applied == [True, True, False, True, True], (stage, applied)
        assert skipped == 1
    assert len({scale for *_, scale in results}) == 1  # every rank lowered its loss scale together


# ---------------------------------------------------------------------------------------- expert-like group
def expert_rank(rank, world, zero_stage):
    dims = dscomm.ParallelDims(world, expert=2)  # data 4; ranks {0, 2} and {1, 3} hold the same "expert"
    groups = dims.build()
    torch.manual_seed(0)
    dense = nn.Linear(4, 4).double()
    torch.manual_seed(10 + groups.rank_in("expert"))  # each expert-parallel rank holds a different expert
    expert = nn.Linear(4, 4).double()
    model = nn.ModuleDict({"dense": dense, "expert": expert})
    opt = torch.optim.SGD([{"params": dense.parameters()},
                           {"params": expert.parameters(), "moe": True, "process_group": groups.expert_data,
                            "gradient_average_over": groups.size("data")}], lr=0.5)
    zero = dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=zero_stage, reduce_bucket_size=10),
                                group=groups.data, precision="fp64")
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
        zero.backward(expert(dense(x)).pow(2).mean())
        zero.step()
        zero.zero_grad()
    with dszero.GatheredParameters(list(model.parameters())):  # stage 3: whole for the comparison
        whole = [p.detach().clone() for p in expert.parameters()], [p.detach().clone() for p in dense.parameters()]
    units = getattr(zero, "groups", []) if zero_stage == 3 else []
    unit_groups = sorted({dist.get_world_size(unit.group) for unit in units})
    return groups.ranks("expert_data"), *whole, unit_groups


def expert_reference(world=4, ep=2):
    torch.manual_seed(0)
    dense = nn.Linear(4, 4).double()
    experts = []
    for index in range(ep):
        torch.manual_seed(10 + index)
        experts.append(nn.Linear(4, 4).double())
    params = list(dense.parameters()) + [p for e in experts for p in e.parameters()]
    opt = torch.optim.SGD(params, lr=0.5)
    for step in range(3):
        for rank in range(world):
            gen = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
            # Mean over the data-parallel ranks: every gradient, dense or expert, is divided by the world.
            (experts[rank % ep](dense(x)).pow(2).mean() / world).backward()
        opt.step()
        opt.zero_grad()
    return [list(e.parameters()) for e in experts], list(dense.parameters())


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_an_expert_group_partitions_and_reduces_over_its_own_group_only(zero_stage):
    experts, dense = expert_reference()
    for rank, (ranks, expert_params, dense_params, unit_groups) in enumerate(run_ranks(expert_rank, 4, zero_stage,
                                                                                       timeout=120)):
        assert ranks == ([0, 2] if rank % 2 == 0 else [1, 3])
        # stage 3: the dense unit partitioned over the 4 data ranks, the expert's over its 2 expert-data ranks
        assert unit_groups == ([2, 4] if zero_stage == 3 else []), unit_groups
        for got, want in zip(expert_params, experts[rank % 2], strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-14)
        for got, want in zip(dense_params, dense, strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-14)
