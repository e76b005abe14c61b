"""fp16 loss scaling (overflow skips the step and lowers the scale), bf16 training, and the scaler's rules."""

import math

import pytest
import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import FP16Config, ZeroConfig


def test_dynamic_scaler_follows_the_reference():
    scaler = dszero.Precision("fp16", initial_scale_power=4, loss_scale_window=3, hysteresis=2,
                              min_loss_scale=2).make_scaler()
    assert scaler.scale == 16
    scaler.update(True)                      # first overflow: hysteresis absorbs it
    assert scaler.scale == 16
    scaler.update(True)                      # second: halve
    assert scaler.scale == 8
    for _ in range(3):                       # a window of clean steps...
        scaler.update(False)
    assert scaler.scale == 8
    scaler.update(False)                     # ...then the next clean step doubles, as DeepSpeed's scaler does
    assert scaler.scale == 16
    for _ in range(10):
        scaler.update(True)
    assert scaler.scale == 2                 # never below min_loss_scale
    assert (scaler.cur_scale, scaler.cur_iter, scaler.scale_window, scaler.delayed_shift) == (2, 16, 3, 2)


def test_static_scale_and_precision_from_config():
    precision = dszero.Precision.from_config(FP16Config(enabled=True, loss_scale=128.0))
    scaler = precision.make_scaler()
    scaler.update(True)
    assert (precision.dtype, scaler.scale, scaler.dynamic, scaler.cur_scale) == ("fp16", 128.0, False, 128.0)
    with pytest.raises(dszero.ZeroConfigError, match="valid: fp32, fp16, bf16"):
        dszero.Precision("fp8")


def overflow_then_train(rank, world, stage):
    model = make_model().half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    zero = dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=stage, reduce_bucket_size=3000),
                                precision=dszero.Precision("fp16", initial_scale_power=8, hysteresis=1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert zero.overflow is False  # DeepSpeed's attribute: no step yet, no overflow
    tokens = next(batches(1, 1, world, rank))[0]
    # A gradient of inf: every rank must skip the same step.
    out = model(tokens[:, :-1]).float().sum() * (float("inf") if rank == 0 else 1.0)
    zero.backward(out)
    taken = zero.step()
    assert zero.overflow is True  # the skipped step's overflow, as DeepSpeed-Chat's get_overflow reads it
    zero.zero_grad()
    unchanged = all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    scale_after = zero.loss_scale
    assert zero.loss_scaler.cur_scale == zero.cur_scale == scale_after and zero.dynamic_loss_scale
    losses = []
    for _ in range(5):  # the same batch: the loss must fall once steps are taken again
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).float().reshape(-1, 64),
                                                 tokens[:, 1:].reshape(-1))
        zero.backward(loss)
        assert zero.step()
        assert zero.overflow is False
        zero.zero_grad()
        losses.append(loss.item())
    return taken, unchanged, scale_after, math.isinf(zero.get_global_grad_norm() or 0), losses, zero.skipped_steps


@pytest.mark.parametrize("stage", [0, 2])
def test_fp16_overflow_skips_the_step_and_halves_the_scale(stage):
    for taken, unchanged, scale, _, losses, skipped in run_ranks(overflow_then_train, 2, stage, timeout=120):
        assert taken is False and unchanged and scale == 128.0 and skipped == 1
        assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]


def bf16_training(rank, world):
    model = make_model().to(torch.bfloat16)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), ZeroConfig(stage=2),
                                precision="bf16")
    losses = []
    tokens = next(batches(1, 1, world, rank))[0]
    for _ in range(8):
        loss = loss_of(model, tokens).float()
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
    report = zero.memory_report()
    return losses, report["master_weights"], report["parameters"]


def test_bf16_trains_with_fp32_master_weights():
    for losses, master, params in run_ranks(bf16_training, 2, timeout=120):
        assert losses[-1] < losses[0]
        assert master == params  # fp32 master shard (1/2 of the elements) = bf16 model (all elements)


def wrong_dtype(rank, world):
    model = make_model()
    try:
        dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), ZeroConfig(stage=1), precision="bf16")
    except dszero.ZeroError as exc:
        return str(exc)
    return "accepted"


def test_model_dtype_must_match_the_precision():
    message = run_ranks(wrong_dtype, 1, timeout=60)[0]
    assert "but the precision is bf16; call model.to(torch.bfloat16)" in message


def test_loss_scale_config_is_the_scaler_under_deepspeeds_names():
    def run(rank, world):
        model = torch.nn.Linear(4, 4).half()
        zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=1.0), ZeroConfig(stage=1),
                                    precision=dszero.Precision("fp16", initial_scale_power=5, loss_scale_window=3,
                                                               min_loss_scale=0.5))
        config = zero.loss_scale_config
        fixed = dszero.Precision("bf16").make_scaler()  # what a bf16 or fp32 optimizer's loss_scale_config is
        return (config.dynamic_loss_scale, config.cur_scale, config.scale_window, config.min_loss_scale,
                config.cur_iter, zero.loss_scaler.loss_scale, fixed.dynamic_loss_scale, fixed.cur_scale,
                fixed.loss_scale, fixed.min_loss_scale)

    for values in run_ranks(run, 1, timeout=60):
        assert values == (True, 32.0, 3, 0.5, 0, 32.0, False, 1.0, 1.0, None)
