"""Each DeepSpeed schedule against its formula, written out here independently, at many steps."""

import logging
import math

import pytest
import torch

import dsconfig
from dstrain.lr_schedules import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR


def _adam(lr=0.1, groups=1):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(groups)]
    return torch.optim.Adam([{"params": [p]} for p in params], lr=lr)


def _run(sched, steps):
    """lr of group 0 after each of `steps` steps (the schedule's own view and the optimizer's agree)."""
    seen = []
    for _ in range(steps):
        sched.step()
        assert sched.get_last_lr() == [g["lr"] for g in sched.optimizer.param_groups]
        seen.append(sched.optimizer.param_groups[0]["lr"])
    return seen


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_lr_curve(kind):
    opt = _adam()
    sched = WarmupLR(opt, warmup_min_lr=0.01, warmup_max_lr=0.5, warmup_num_steps=10, warmup_type=kind)
    assert opt.param_groups[0]["lr"] == 0.01  # a fresh schedule starts at warmup_min_lr
    for it, lr in enumerate(_run(sched, 25)):
        if it < 10:
            frac = math.log(it + 1) / math.log(10) if kind == "log" else it / 10
        else:
            frac = 1.0
        assert lr == pytest.approx(0.01 + 0.49 * frac, rel=1e-12, abs=1e-15)


def test_warmup_lr_defaults_and_per_group_values(caplog):
    opt = _adam(lr=0.3, groups=2)
    sched = WarmupLR(opt, warmup_min_lr=[0.0, 0.1], warmup_num_steps=1)  # max_lr from the group, steps >= 2
    assert sched.warmup_num_steps == 2 and sched.max_lrs == [0.3, 0.3]
    sched.step()
    sched.step()
    assert sched.get_last_lr() == pytest.approx([0.3, 0.3])
    assert WarmupLR(opt, warmup_num_steps=0).warmup_num_steps == 2  # DeepSpeed's configs use 0 for no warmup
    with pytest.raises(ValueError, match="warmup_num_steps"):
        WarmupLR(opt, warmup_num_steps=-1)
    with caplog.at_level(logging.WARNING, logger="dstrain.lr_schedules"):  # DeepSpeed's fall-back, named
        assert WarmupLR(opt, warmup_type="cosine").warmup_type == "log"
        assert WarmupCosineLR(opt, total_num_steps=10, warmup_type="cosine").warmup_type == "log"
    assert caplog.text.count("warmup_type 'cosine' is not one of 'log', 'linear'") == 2
    with pytest.raises(dsconfig.ConfigError, match=r"scheduler\.params\.warmup_type"):  # in a config, refused by key
        dsconfig.load({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})
    with pytest.raises(ValueError, match="2 values"):
        WarmupLR(opt, warmup_min_lr=[0.0, 0.1, 0.2])


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_decay_lr_curve(kind):
    sched = WarmupDecayLR(_adam(), total_num_steps=30, warmup_min_lr=0.0, warmup_max_lr=0.2,
                          warmup_num_steps=8, warmup_type=kind)
    for it, lr in enumerate(_run(sched, 40)):
        if it < 8:
            gamma = math.log(it + 1) / math.log(8) if kind == "log" else it / 8
        else:
            gamma = max(0.0, (30 - it) / (30 - 8))
        assert lr == pytest.approx(0.2 * gamma, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_cosine_lr_curve(kind):
    opt = _adam(lr=0.4, groups=2)
    opt.param_groups[1]["lr"] = 0.04
    sched = WarmupCosineLR(opt, total_num_steps=40, warmup_min_ratio=0.1, warmup_num_steps=6,
                           cos_min_ratio=0.01, warmup_type=kind)
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    for it in range(50):
        sched.step()
        if it < 6:
            w = math.log(it + 1) / math.log(6) if kind == "log" else it / 6
            ratio = 0.1 + 0.9 * w
        else:
            progress = min(1.0, (it - 6 + 1) / (40 - 6))
            ratio = 0.01 + 0.99 * (1 + math.cos(math.pi * progress)) / 2
        assert sched.get_last_lr() == pytest.approx([0.4 * ratio, 0.04 * ratio], rel=1e-12)


def _one_cycle_reference(it, lo, hi, first, second, decay_rate=0.0, decay_size=0):
    """lr after the (it+1)-th step: triangle up over `first`, down over `second`, then decay."""
    total = first + second
    if it < total:
        k = it + 1
        if k <= first:
            return lo + (hi - lo) * k / first
        return lo + (hi - lo) * (total - k) / second
    if decay_size == 0 or decay_rate == 0:
        return lo
    return lo / (1 + decay_rate * (it - total + 1) / decay_size)


def test_one_cycle_lr_and_momentum():
    opt = _adam()
    sched = OneCycle(opt, cycle_min_lr=0.01, cycle_max_lr=0.1, decay_lr_rate=0.5, cycle_first_step_size=10,
                     cycle_second_step_size=6, decay_step_size=4, cycle_min_mom=0.85, cycle_max_mom=0.95,
                     decay_mom_rate=0.01)
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["betas"] == (0.85, 0.99)
    for it in range(30):
        sched.step()
        lr = opt.param_groups[0]["lr"]
        assert lr == pytest.approx(_one_cycle_reference(it, 0.01, 0.1, 10, 6, 0.5, 4), rel=1e-9, abs=1e-15)
        beta1, beta2 = opt.param_groups[0]["betas"]
        assert beta2 == 0.99
        if it < 16:  # momentum mirrors lr: max_mom at min_lr
            scale = (lr - 0.01) / (0.1 - 0.01)
            assert beta1 == pytest.approx(0.95 - 0.1 * scale, rel=1e-9)
        else:
            assert beta1 == pytest.approx(0.95 * (1 + 0.01 * (it - 16 + 1) / 4), rel=1e-12)


def test_one_cycle_staircase_and_no_betas():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, momentum=0.9)
    sched = OneCycle(opt, cycle_min_lr=0.0, cycle_max_lr=1.0, cycle_first_step_size=8, cycle_first_stair_count=4)
    assert not sched.cycle_momentum and sched.get_mom() is None  # SGD has no betas to cycle
    lrs = _run(sched, 16)
    # 4 stairs per half: flat for 2 steps each, reaching exactly the peak, then back down
    expected_up = [math.floor((k) * 4 / 8) / 4 for k in range(1, 9)]
    expected_down = [math.floor((16 - k) * 4 / 8) / 4 for k in range(9, 17)]
    assert lrs == pytest.approx(expected_up + expected_down)
    assert max(lrs) == 1.0
    assert opt.param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize("staircase", [False, True])
def test_lr_range_test_curve(staircase):
    opt = _adam(groups=2)
    sched = LRRangeTest(opt, lr_range_test_min_lr=[0.001, 0.002], lr_range_test_step_size=5,
                        lr_range_test_step_rate=2.0, lr_range_test_staircase=staircase)
    assert [g["lr"] for g in opt.param_groups] == [0.001, 0.002]
    for it in range(23):
        sched.step()
        interval = (it + 1) / 5
        if staircase:
            interval = math.floor(interval)
        factor = 1 + 2.0 * interval
        assert sched.get_last_lr() == pytest.approx([0.001 * factor, 0.002 * factor], rel=1e-12)


_FACTORIES = {
    "WarmupLR": lambda o, it=-1: WarmupLR(o, 0.0, 0.1, 7, last_batch_iteration=it),
    "WarmupDecayLR": lambda o, it=-1: WarmupDecayLR(o, 20, 0.0, 0.1, 7, last_batch_iteration=it),
    "WarmupCosineLR": lambda o, it=-1: WarmupCosineLR(o, 20, 0.05, 7, last_batch_iteration=it),
    "OneCycle": lambda o, it=-1: OneCycle(o, 0.01, 0.1, 0.1, 5, 4, decay_step_size=2, last_batch_iteration=it),
    "LRRangeTest": lambda o, it=-1: LRRangeTest(o, 0.01, 3, 1.5, True, last_batch_iteration=it),
}


@pytest.mark.parametrize("name", list(_FACTORIES))
def test_state_dict_round_trip_resumes_the_curve(name):
    straight = _FACTORIES[name](_adam())
    expected = _run(straight, 25)

    first = _FACTORIES[name](_adam())
    head = _run(first, 11)
    state = first.state_dict()
    assert state == {"last_batch_iteration": 10}

    resumed = _FACTORIES[name](_adam())  # built fresh, as an engine does before loading a checkpoint
    resumed.load_state_dict(state)
    assert head + _run(resumed, 14) == pytest.approx(expected, rel=1e-12)

    # a schedule built with last_batch_iteration leaves the optimizer's lr alone until it steps
    opt = _adam(lr=0.123)
    late = _FACTORIES[name](opt, 10) if name != "WarmupCosineLR" else None
    if late is not None:
        assert opt.param_groups[0]["lr"] == 0.123
        assert _run(late, 14) == pytest.approx(expected[11:], rel=1e-12)


def test_wrapped_optimizer_and_tensor_lr():
    class Wrapper:  # a ZeRO / fp16 wrapper exposes the real optimizer as .optimizer
        def __init__(self, optimizer):
            self.optimizer = optimizer

    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=torch.tensor(0.1))
    sched = WarmupLR(Wrapper(opt), 0.0, 0.1, 4, warmup_type="linear")
    sched.step()
    sched.step()
    assert torch.is_tensor(opt.param_groups[0]["lr"])
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.025)
    with pytest.raises(TypeError, match="is not a torch"):
        WarmupLR(object())


@pytest.mark.parametrize("shape", [(), (1,)])
def test_a_tensor_lr_of_any_one_element_shape_stays_the_same_tensor(shape):
    lr = torch.full(shape, 0.1, dtype=torch.float64)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = WarmupLR(opt)  # warmup_max_lr left out: each group's own lr, the tensor's value
    sched.step(1)
    assert opt.param_groups[0]["lr"] is lr and lr.shape == shape and lr.dtype == torch.float64
    assert lr.item() == pytest.approx(0.1 * math.log(2) / math.log(1000))


@pytest.mark.parametrize("first, second", [(0, 0), (0, None), (-1, None), (0, 100), (100, -1), (True, None)])
def test_one_cycle_refuses_a_cycle_without_a_rising_half(first, second):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match=r"cycle_(first|second)_step_size"):
        OneCycle(opt, cycle_min_lr=0.001, cycle_max_lr=0.1, cycle_first_step_size=first, cycle_second_step_size=second)


def test_one_cycle_with_an_empty_falling_half():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = OneCycle(opt, cycle_min_lr=0.001, cycle_max_lr=0.1, cycle_first_step_size=100, cycle_second_step_size=0)
    assert sched.step_ratio == 1.0 and sched.get_lr() == [pytest.approx(0.001)]
