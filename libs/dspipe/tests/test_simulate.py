"""The simulator's timing model, its costs, and the trace format."""

import json

import pytest

import dspipe.schedules as sch
from dspipe.schedules import Action, Costs, Kind, ScheduleError, Timeline, TraceEvent


def _starts(timeline, rank):
    return {str(e.action): e.start for e in timeline.events if e.rank == rank}


def test_one_micro_batch_through_two_ranks_with_message_latency():
    timeline = sch.simulate(sch.one_f_one_b(2, 1), Costs(forward=1, backward=2, comm=0.5))
    assert _starts(timeline, 0) == {"0F0": 0, "0B0": 5.0}  # 1B0 ends at 4.5, its gradient arrives 0.5 later
    assert _starts(timeline, 1) == {"1F0": 1.5, "1B0": 2.5}
    assert timeline.makespan == 7.0
    assert timeline.busy == (3, 3) and timeline.idle == (4, 4)
    assert timeline.bubble == pytest.approx(8 / 6)
    assert timeline.idle_fraction == pytest.approx(8 / 14)


@pytest.mark.parametrize("name", ["1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"])
def test_a_lowered_program_takes_as_long_as_its_compute_schedule(name):
    compute = sch.build_schedule(name, 3, 6)
    program = sch.lower(compute, sch.placement(name, 3))
    for costs in (Costs(), Costs(forward=1.3, backward=2.1, input_grad=1.2, weight_grad=0.9, comm=0.4)):
        assert sch.simulate(program, costs).makespan == pytest.approx(sch.simulate(compute, costs).makespan)
    # sends and receives that take time slow the program down
    slow = sch.simulate(program, Costs(send=0.1, recv=0.1)).makespan
    assert slow > sch.simulate(compute).makespan


def test_costs_by_mapping_by_stage_and_their_errors():
    assert Costs.from_mapping({"F": 2, "B": 3, "comm": 1}) == Costs(forward=2, backward=3, comm=1)
    with pytest.raises(ScheduleError, match="unknown cost 'X'; valid: F, B, I, W, comm"):
        Costs.from_mapping({"X": 1})
    for bad in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ScheduleError, match="finite number >= 0"):
            Costs(forward=bad)
    slow_last = Costs(per_stage={(Kind.F, 1): 5.0})
    timeline = sch.simulate(sch.gpipe(2, 2), slow_last)
    assert [e.duration for e in timeline.events if e.rank == 1 and e.action.kind is Kind.F] == [5.0, 5.0]
    assert sch.simulate(sch.gpipe(2, 2), {"F": 2}).makespan == sch.simulate(sch.gpipe(2, 2), Costs(forward=2)).makespan
    with pytest.raises(ScheduleError, match="costs must be"):
        sch.simulate(sch.gpipe(2, 2), 3)


def test_peak_activations_count_until_the_backward_completes():
    timeline = sch.simulate(sch.gpipe(3, 5))
    assert timeline.peak_activations == (5, 5, 5)
    assert sch.simulate(sch.zb_h1(4, 8)).peak_activations == (4, 4, 4, 4)  # until W, which trails by `rank`


def test_timeline_of_measured_events_shifts_to_zero_and_measures_the_bubble():
    events = [TraceEvent(0, Action.parse("0F0"), 10.0, 11.0), TraceEvent(1, Action.parse("1F0"), 11.0, 12.0),
              TraceEvent(1, Action.parse("1B0"), 12.0, 14.0), TraceEvent(0, Action.parse("0RECV_B0"), 11.0, 14.0),
              TraceEvent(0, Action.parse("0B0"), 14.0, 16.0)]
    timeline = Timeline.of(events)
    assert timeline.ranks == 2 and timeline.makespan == 6.0
    assert timeline.busy == (3.0, 3.0)  # the wait on the receive is idle time
    assert timeline.bubble == pytest.approx(1.0)
    costs = Costs.from_trace(events)
    assert costs.of(Action.parse("1B0")) == 2.0 and costs.of(Action.parse("0F0")) == 1.0
    assert sch.simulate(sch.one_f_one_b(2, 1), costs).makespan == 6.0


def test_trace_files_round_trip_and_merge(tmp_path):
    recorder = sch.TraceRecorder(rank=1, clock=iter([1.0, 2.5, 3.0, 4.0]).__next__)
    with recorder.record(Action.parse("1F0")):
        pass
    with recorder.record(Action.parse("1SEND_F0")):
        pass
    sch.write_trace(tmp_path / "rank1.json", recorder.events)
    sch.write_trace(tmp_path / "rank0.json", [TraceEvent(0, Action.parse("0F0"), 0.0, 1.0)])
    assert json.loads((tmp_path / "rank1.json").read_text())[0] == {"rank": 1, "action": "1F0", "start": 1.0,
                                                                    "end": 2.5}
    merged = sch.read_trace(tmp_path / "rank1.json", tmp_path / "rank0.json")
    assert [str(e.action) for e in merged] == ["0F0", "1F0", "1SEND_F0"]
    assert merged[1] == TraceEvent(1, Action.parse("1F0"), 1.0, 2.5)
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("content, message", [
    ("{", "not a JSON trace"),
    ('{"rank": 0}', "a trace is a JSON array"),
    ("[1]", "entry \\[0\\]: expected an object"),
    ('[{"rank": 0, "action": "0F0", "start": 0}]', "missing end"),
    ('[{"rank": -1, "action": "0F0", "start": 0, "end": 1}]', "rank must be an int"),
    ('[{"rank": 0, "action": "rm -rf", "start": 0, "end": 1}]', "cannot read action"),
    ('[{"rank": 0, "action": "0F0", "start": "0", "end": 1}]', "start must be a finite number"),
    ('[{"rank": 0, "action": "0F0", "start": 0, "end": NaN}]', "end must be a finite number"),
    ('[{"rank": 0, "action": "0F0", "start": 2, "end": 1}]', "end 1.0 is before start 2.0"),
])
def test_hostile_trace_files_fail_with_the_entry_named(tmp_path, content, message):
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(ScheduleError, match=message):
        sch.read_trace(path)


def test_a_missing_trace_file_is_named(tmp_path):
    with pytest.raises(ScheduleError, match=r"nope\.json: cannot read trace file"):
        sch.read_trace(tmp_path / "nope.json")
