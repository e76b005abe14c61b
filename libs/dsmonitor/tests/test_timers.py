"""Timers against known sleeps."""

import logging
import time

import pytest

from dsmonitor import MonitorConfigError, MonitorError, SynchronizedWallClockTimer, ThroughputTimer, events

SLEEP = 0.05


class Outer:
    """Wall time around a block, in ms: the most a timer inside it may report, however loaded the machine."""

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.ms = (time.perf_counter() - self.t0) * 1000


def timed(timer, seconds=SLEEP, **stop):
    with Outer() as outer:
        timer.start()
        time.sleep(seconds)
        timer.stop(**stop)
    return outer.ms


def test_named_timer_measures_a_sleep_in_ms():
    timers = SynchronizedWallClockTimer()
    first = timed(timers("fwd"))
    ms = timers("fwd").elapsed(reset=False)
    assert 1000 * SLEEP <= ms <= first
    # start/stop pairs accumulate until a reset
    second = timed(timers("fwd"))
    assert 2000 * SLEEP <= timers("fwd").elapsed() <= first + second
    assert timers("fwd").elapsed() == 0.0  # the previous call reset it


def test_elapsed_of_a_running_timer_keeps_it_running():
    timers = SynchronizedWallClockTimer()
    timers("step").start()
    time.sleep(SLEEP)
    assert timers("step").elapsed() >= 1000 * SLEEP
    assert timers("step").started
    timers("step").stop()


def test_mean_of_recorded_durations_and_has():
    timers = SynchronizedWallClockTimer()
    outer = [timed(timers("bwd"), record=True) for _ in range(2)]
    assert timers.has("bwd") and not timers.has("fwd")
    mean = timers.get_mean(["bwd", "fwd"])
    assert list(mean) == ["bwd"] and 1000 * SLEEP <= mean["bwd"] <= sum(outer) / 2


def test_misuse_names_the_timer():
    timers = SynchronizedWallClockTimer()
    with pytest.raises(MonitorError, match="'fwd' is not running"):
        timers("fwd").stop()
    timers("fwd").start()
    with pytest.raises(MonitorError, match="'fwd' is already running"):
        timers("fwd").start()
    with pytest.raises(MonitorConfigError, match="normalizer must be positive"):
        timers.log(["fwd"], normalizer=0)


def test_log_line_is_the_engines_wall_clock_breakdown(caplog):
    timers = SynchronizedWallClockTimer()
    outer = {name: timed(timers(name), 0.01) for name in ("fwd", "bwd", "step")}
    with caplog.at_level(logging.INFO, logger="dsmonitor"):
        line = timers.log(["fwd", "bwd", "bwd_allreduce", "step"], normalizer=2)
    parts = line.split(" | ")
    assert parts[0] == "time (ms)" and [p.split(":")[0] for p in parts[1:]] == ["fwd", "bwd", "step"]
    for name, ms in (p.split(": ") for p in parts[1:]):  # 10 ms / normalizer 2, printed to 0.01 ms
        assert 4.99 <= float(ms) <= outer[name] / 2 + 0.01, (name, ms, outer[name])
    assert line in caplog.messages  # rank 0 logs it


def test_breakdown_events_carry_the_reference_names():
    timers = SynchronizedWallClockTimer()
    for name in ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"):
        timers(name).start()
        timers(name).stop()
    evts = timers.events(step=64)
    assert [e[0] for e in evts] == [events.ELAPSED_FORWARD, events.ELAPSED_BACKWARD, events.ELAPSED_BACKWARD_INNER,
                                   events.ELAPSED_BACKWARD_ALLREDUCE, events.ELAPSED_STEP]
    assert all(step == 64 and value >= 0 for _, value, step in evts)


def test_throughput_timer_skips_warm_up_and_reports_samples_and_tflops():
    lines = []
    timer = ThroughputTimer(batch_size=8, start_step=2, steps_per_output=2, flops_per_sample=1e12,
                            logging_fn=lines.append)
    # Slow warm-up steps must not count: counted, they would pull the rate far below the bound.
    outer = [timed(timer, 0.5 if step < 2 else SLEEP, global_step=True) for step in range(6)]
    assert timer.timed_steps == 4
    rate = timer.avg_samples_per_sec()
    assert 8 * 4 / (sum(outer[2:]) / 1000) <= rate <= 8 / SLEEP
    assert timer.avg_tflops() == pytest.approx(rate * 1e12 / 1e12)
    assert len(lines) == 2  # after global steps 4 and 6; none during warm-up
    assert lines[-1].startswith("epoch=0/micro_step=6/global_step=6, RunningAvgSamplesPerSec=")
    assert "CurrSamplesPerSec=" in lines[-1] and "TFLOPS=" in lines[-1]


def test_throughput_timer_micro_steps_accumulate_into_a_global_step():
    timer = ThroughputTimer(batch_size=4, start_step=0, logging_fn=lambda _: None)
    outer = [timed(timer, SLEEP / 2, global_step=micro % 2 == 1) for micro in range(4)]
    assert timer.global_step_count == 2 and timer.micro_step_count == 4
    assert 4 * 2 / (sum(outer) / 1000) <= timer.avg_samples_per_sec() <= 4 / SLEEP


def test_throughput_timer_shows_when_it_started_and_what_each_timed_micro_step_took():
    timer = ThroughputTimer(batch_size=4, start_step=1, logging_fn=lambda _: None)
    timer.stop()  # before any start: nothing happens
    assert not timer.initialized and timer.micro_step_count == 0
    timer.start()
    assert timer.initialized and timer.started and timer.start_time == 0  # a warm-up step is not timed
    timer.stop(global_step=True)
    assert timer.total_elapsed_time == 0 and timer.global_step_count == 1
    timer.start()
    time.sleep(SLEEP)
    timer.stop()
    first = timer.end_time - timer.start_time
    assert first >= SLEEP and timer.total_elapsed_time == first and timer.step_elapsed_time == first
    timer.start()
    timer.stop(global_step=True)
    assert timer.total_elapsed_time == first + (timer.end_time - timer.start_time)
    assert timer.step_elapsed_time == 0  # a global step ended: the next one starts from nothing


def test_throughput_timer_rejects_bad_arguments():
    with pytest.raises(MonitorConfigError, match="batch_size must be at least 1"):
        ThroughputTimer(batch_size=0)
