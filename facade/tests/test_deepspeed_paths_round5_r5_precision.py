"""DeepSpeed names its own unit tests use (issue 35, round 5, precision and gradient reduction), resolved under the
alias and used: `engine.coalesce_grad_reduction()` (v1/zero/test_zero_coalesce_grad_reduction.py: one reduction per
block, step() and no_sync() refused inside, the boundary flag DeepSpeed keeps), `optimizer.loss_scale_config`
(runtime/half_precision/test_dynamic_loss_scale.py) and DeepSpeedCPUAdam's `adam_w_mode` (ops/adam/test_adamw.py).
One subprocess: the alias is process-wide."""

import pytest
import torch
from alias_snippet import run_alias_snippet

import dstrain
from dscomm.testing import run_ranks

SNIPPET = r"""
import dstrain.as_deepspeed
import contextlib, os, sys
import deepspeed, torch
from deepspeed.ops.adam import DeepSpeedCPUAdam

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])


def build(stage, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    config = {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": stage}, **extra}
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[:2]


def train(stage, coalesce):
    engine, _ = build(stage)
    torch.manual_seed(1)
    batches = [torch.randn(2, 4) for _ in range(3)]
    with engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext():
        for i, x in enumerate(batches):
            engine.set_gradient_accumulation_boundary(i == len(batches) - 1)
            engine.backward(engine(x).pow(2).sum())
    engine.step()
    return [p.detach().clone() for p in engine.module.parameters()]


for stage in (1, 2, 3):
    for a, b in zip(train(stage, False), train(stage, True)):
        assert torch.equal(a, b), stage

engine, optimizer = build(2, fp16={"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2})
assert optimizer.loss_scale_config.dynamic_loss_scale and optimizer.loss_scale_config.cur_scale == 2 ** 8
assert optimizer.loss_scale_config.scale_window == 2 and optimizer.loss_scale_config.cur_iter == 0
assert engine.pipeline_parallelism is False
engine.set_gradient_accumulation_boundary(False)
with engine.coalesce_grad_reduction():
    try:
        engine.step()
        raise SystemExit("step() inside coalesce_grad_reduction was accepted")
    except AssertionError as exc:
        assert "no_sync" in str(exc), exc
    try:
        with engine.no_sync():
            pass
        raise SystemExit("no_sync() inside coalesce_grad_reduction was accepted")
    except AssertionError as exc:
        assert "no_sync" in str(exc), exc
assert engine._is_gradient_accumulation_boundary is False
engine, _ = build(1)
with engine.no_sync():
    try:
        with engine.coalesce_grad_reduction():
            pass
        raise SystemExit("coalesce_grad_reduction inside no_sync() was accepted")
    except AssertionError as exc:
        assert "nested" in str(exc), exc

engine, _ = build(2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}},
                  optimizer={"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}})
assert isinstance(engine.optimizer.optimizer, DeepSpeedCPUAdam) and engine.optimizer.optimizer.adam_w_mode is False
print("ok")
"""


def test_round5_precision_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)


def _skipped_after_a_nan_gradient(rank, world, check):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    engine, *_ = dstrain.initialize(model=model, model_parameters=model.parameters(), config={
        "train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "bf16": {"enabled": True, "check_grad_overflow": check}, "zero_optimization": {"stage": 1}})
    engine.backward(engine(torch.ones(1, 4, dtype=torch.bfloat16)).sum() * float("nan"))
    engine.step()
    return engine.skipped_steps, all(bool(p.isfinite().all()) for p in engine.module.parameters())


@pytest.mark.parametrize("check", [True, False])
def test_a_bf16_step_with_non_finite_gradients_is_skipped_whatever_check_grad_overflow(check):
    """bf16.check_grad_overflow (DeepSpeed's runtime/half_precision/test_zero_optim_overflow.py sets it) is accepted;
    true is what dstrain does anyway, and false does not let a non-finite update through (dstrain's safety rule)."""
    assert run_ranks(_skipped_after_a_nan_gradient, 1, check, timeout=120) == [(1, True)]
