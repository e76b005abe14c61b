"""fp16 (dynamic scale, overflow skips, auto_cast), bf16, torch_autocast and communication settings."""

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dsconfig
import dstrain
from dscomm.testing import run_ranks


def train(rank, world, steps, **extra):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer=ADAMW, **extra))
    data = TokenDataset().data
    record = []
    for i in range(steps):
        loss = engine(data[(i % 2) * 4:(i % 2 + 1) * 4])  # two batches: the loss must fall
        engine.backward(loss)
        engine.step()
        record.append((loss.item(), engine.was_step_applied(), engine.loss_scale, engine.skipped_steps))
    dtypes = {p.dtype for p in model.parameters()}
    return record, dtypes


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    fp16 = {"enabled": True, "initial_scale_power": 24, "hysteresis": 1}  # 2**24 overflows fp16 gradients
    record, dtypes = run_ranks(train, 2, 12, fp16=fp16)[0]
    assert dtypes == {torch.float16}
    _first_loss, applied, scale, skipped = record[0]
    assert not applied and skipped == 1 and scale == 2.0**23
    assert record[-1][1] and record[-1][2] < 2.0**23
    assert sum(1 for r in record if not r[1]) == record[-1][3]


def test_fp16_static_loss_scale_trains():
    record, _ = run_ranks(train, 1, 8, fp16={"enabled": True, "loss_scale": 128.0})[0]
    assert all(r[1] for r in record) and record[0][2] == 128.0
    assert record[-1][0] < record[0][0]


def test_bf16_trains_with_bf16_parameters():
    record, dtypes = run_ranks(train, 2, 6, bf16={"enabled": True}, zero_optimization={"stage": 2})[0]
    assert dtypes == {torch.bfloat16} and all(r[1] for r in record)
    assert record[-1][0] < record[0][0]


def autocast_forward(rank, world):
    model = make_model()
    seen = []
    model.head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer=ADAMW, torch_autocast={"enabled": True}))
    engine.backward(engine(TokenDataset().data[:4]))
    engine.step()
    return seen, {p.dtype for p in model.parameters()}


def test_torch_autocast_runs_matmuls_in_bf16_and_keeps_fp32_weights():
    seen, dtypes = run_ranks(autocast_forward, 1)[0]
    assert seen == [torch.bfloat16] and dtypes == {torch.float32}


class TakesFloats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        self.seen = (x.dtype, y.dtype)
        return ((self.linear(x) - y.float()) ** 2).mean()


def auto_cast(rank, world):
    model = TakesFloats()
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer=ADAMW, fp16={"enabled": True,
                                                                                     "auto_cast": True}))
    engine.backward(engine(torch.randn(3, 4), torch.randn(3, 1)))
    engine.step()
    return model.seen


def test_fp16_auto_cast_casts_float_inputs():
    assert run_ranks(auto_cast, 1)[0] == (torch.float16, torch.float16)


def grads_after_one_step(rank, world, op, stage=0, **extra):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer={"type": "SGD", "params": {"lr": 1.0}},
                                                               gradient_allreduce_op=op, stage=stage, **extra))
    with dstrain.zero.GatheredParameters([model.head.bias]):  # whole at stage 3 too
        before = model.head.bias.detach().clone()
    engine.backward(engine(TokenDataset().data[rank * 4:(rank + 1) * 4]))
    engine.step()
    with dstrain.zero.GatheredParameters([model.head.bias]):
        return before - model.head.bias.detach()  # SGD with lr 1: the reduced gradient


def test_gradient_allreduce_op_sum_is_world_times_mean():
    mean = run_ranks(grads_after_one_step, 2, "mean")[0]
    total = run_ranks(grads_after_one_step, 2, "sum")[0]
    torch.testing.assert_close(total, 2 * mean, rtol=1e-5, atol=1e-7)


def clipped_update(rank, world, clip):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer={"type": "SGD", "params": {"lr": 1.0}},
                                                               gradient_clipping=clip))
    before = [p.detach().clone() for p in model.parameters()]
    engine.backward(engine(TokenDataset().data[:4]))
    engine.step()
    update = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    return update.norm().item(), engine.get_global_grad_norm()


def test_gradient_clipping_bounds_the_update_to_the_clip_norm():
    update, norm = run_ranks(clipped_update, 2, 0.05)[0]
    assert norm > 0.05 and abs(update - 0.05) < 1e-4
    update, norm = run_ranks(clipped_update, 2, 0.0)[0]
    assert abs(update - norm) < 1e-4


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_predivide_and_prescale_give_the_mean(stage):
    mean = run_ranks(grads_after_one_step, 2, "mean", stage)[0]
    for extra in ({"gradient_predivide_factor": 4.0}, {"prescale_gradients": True}):
        got = run_ranks(grads_after_one_step, 2, "mean", stage, **extra)[0]
        torch.testing.assert_close(got, mean, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_communication_data_type_reduces_in_that_dtype(stage):
    exact = run_ranks(grads_after_one_step, 2, "mean", stage)[0]
    wire = run_ranks(grads_after_one_step, 2, "mean", stage, communication_data_type="bf16")[0]
    torch.testing.assert_close(wire, exact, rtol=2e-2, atol=1e-4)  # bf16 keeps 8 bits of mantissa
    assert not torch.equal(wire, exact)


class RotaryLike(torch.nn.Module):
    """A model with an fp32 buffer it reads in fp32 (as a rotary embedding's inv_freq): its output is cast back."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)

    def forward(self, x):
        angles = (torch.arange(x.shape[0], dtype=torch.float32)[:, None] * self.inv_freq[None, :]).repeat(1, 2)
        return self.linear(x * angles.cos().to(x.dtype)).float().pow(2).mean()


def buffer_dtypes(rank, world, data_types):
    model = RotaryLike()
    cfg = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "data_types": data_types}
    engine, *_ = dstrain.initialize(model=model, config=cfg)
    engine.backward(engine(torch.randn(4, 8, dtype=torch.bfloat16)))
    engine.step()
    return model.linear.weight.dtype, model.inv_freq.dtype


def test_bf16_keeps_fp32_buffers_unless_buffer_dtype_names_one():
    assert run_ranks(buffer_dtypes, 1, {})[0] == (torch.bfloat16, torch.float32)
    assert run_ranks(buffer_dtypes, 1, {"buffer_dtype": "bf16", "param_dtype": "bf16"})[0] == (torch.bfloat16,
                                                                                                torch.bfloat16)


def contradicting_param_dtype(rank, world):
    with pytest.raises(dsconfig.ConfigError, match=r"data_types\.param_dtype.*trains the parameters in bf16"):
        dstrain.initialize(model=RotaryLike(), config={"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                                       "data_types": {"param_dtype": "fp16"}})
    return True


def test_a_param_dtype_the_precision_mode_contradicts_is_refused_by_name():
    assert run_ranks(contradicting_param_dtype, 1)[0]
