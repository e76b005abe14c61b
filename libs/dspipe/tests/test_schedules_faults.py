"""validate() catches planted faults, each with the rank-by-step grid and the faulty cell marked."""

import pytest

import dspipe.schedules as sch
from dspipe.schedules import Action, DeadlockError, Kind, ScheduleError


def _program(name="1f1b", p=3, m=4):
    layout = sch.placement(name, p)
    return sch.lower(sch.build_schedule(name, p, m), layout), layout


def _fault(schedule, placement=None, error=ScheduleError) -> str:
    with pytest.raises(error) as caught:
        sch.validate(schedule, placement)
    text = str(caught.value)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert all(line.startswith(f"rank {r} ") for r, line in enumerate(lines[header + 1:header + 1 + len(schedule)]))
    assert "[" in text  # a marked cell
    return text


def _remove(schedule, text):
    rank = next(r for r, ops in enumerate(schedule) if Action.parse(text) in ops)
    schedule[rank].remove(Action.parse(text))


def test_sound_programs_pass():
    for name in sch.SCHEDULES:
        program, layout = _program(name, 2, 4)
        sch.validate(program, layout)


def test_a_missing_receive_is_marked_at_the_forward_that_needs_it():
    program, _ = _program()
    _remove(program, "1RECV_F2")
    text = _fault(program)
    assert "[1F2]" in text and "1RECV_F2 is missing on rank 1" in text
    assert "[0SEND_F2]" in text and "0SEND_F2 has no matching 1RECV_F2 on rank 1" in text


def test_a_send_without_its_receive_and_a_receive_without_its_send():
    program, _ = _program()
    _remove(program, "2SEND_B1")
    text = _fault(program)
    assert "1RECV_B1 has no matching 2SEND_B1 on rank 2" in text
    assert "2SEND_B1 is missing on rank 2" in text


def test_a_backward_before_its_forward():
    schedule = sch.one_f_one_b(2, 3)
    schedule[1][0], schedule[1][1] = schedule[1][1], schedule[1][0]  # 1B0 before 1F0
    text = _fault(schedule)
    assert "[1B0]" in text and "1B0 runs before 1F0 (step 1), which it needs" in text


def test_a_weight_gradient_before_its_input_gradient():
    schedule = sch.zb_h1(2, 2)
    ops = schedule[1]
    i, w = ops.index(Action.parse("1I0")), ops.index(Action.parse("1W0"))
    ops[i], ops[w] = ops[w], ops[i]
    assert "1W0 runs before 1I0" in _fault(schedule)


def test_missing_and_doubled_compute():
    schedule = sch.gpipe(2, 3)
    schedule[0].remove(Action.parse("0B1"))
    schedule[1].append(Action.parse("1F2"))
    text = _fault(schedule)
    assert "stage 0 micro-batch 1 has no complete backward" in text
    assert "1F2 runs twice" in text and "[1F2]" in text
    split = sch.zb_h1(2, 2)
    split[0].remove(Action.parse("0W1"))
    assert "missing W" in _fault(split)


def test_a_stage_on_two_ranks_and_off_its_placement():
    schedule = sch.one_f_one_b(2, 2)
    schedule[1].append(Action.parse("0W0"))
    assert "stage 0 is on rank 0, but 0W0 runs on rank 1" in _fault(schedule)
    swapped = sch.one_f_one_b(2, 2)[::-1]
    assert "belongs on rank 1" in _fault(swapped, sch.placement("1f1b", 2))


def test_a_message_between_stages_of_one_rank():
    program, layout = _program("zbv", 2, 3)
    ops = program[1]
    at = ops.index(Action.parse("1F0"))
    ops.insert(at + 1, Action.parse("1SEND_F0"))
    ops.insert(ops.index(Action.parse("2F0")), Action.parse("2RECV_F0"))
    assert "stages 1 and 2 are both on rank 1" in _fault(program, layout)


def test_step_and_reductions():
    program, _ = _program()
    program[2].remove(Action(Kind.STEP))
    program[1].remove(Action(Kind.REDUCE_GRAD, 1))
    program[0].insert(0, program[0].pop(program[0].index(Action(Kind.REDUCE_GRAD, 0))))
    text = _fault(program)
    assert "rank 2 must end with exactly one STEP" in text
    assert "rank 1 never reduces the gradients of stage 1" in text
    assert "gradients of stage 0 reduced before its last backward" in text


def test_a_load_after_its_forward():
    program, _ = _program()
    ops = program[0]
    load = ops.pop(ops.index(Action.parse("0LOAD1")))
    ops.insert(ops.index(Action.parse("0F1")) + 1, load)
    assert "micro-batch 1 is loaded after its first forward on rank 0" in _fault(program)


def test_a_cross_rank_cycle_is_a_deadlock_with_each_stuck_rank_marked():
    # rank 0 waits for 1B0 before sending 0F1; rank 1 waits for 0F1 before running 1B0
    schedule = [[Action.parse(t) for t in ["0F0", "0B0", "0F1", "0B1"]],
                [Action.parse(t) for t in ["1F0", "1F1", "1B0", "1B1"]]]
    text = _fault(schedule, error=DeadlockError)
    assert "[0B0]" in text and "[1F1]" in text
    assert "rank 0 is stuck at step 1 (0B0), waiting for 1B0 on rank 1" in text
    lowered = sch.lower(schedule, sch.placement("1f1b", 2))
    assert "[0RECV_B0]" in _fault(lowered, error=DeadlockError)


def test_bad_shapes_are_refused_plainly():
    for bad, message in (([], "non-empty list"), ([["0F0"]], "is not a dspipe.schedules.Action"),
                         ([[Action.parse("0F0")], "x"], "expected a list")):
        with pytest.raises(ScheduleError, match=message):
            sch.validate(bad)
    with pytest.raises(ScheduleError, match="stages \\[1\\] have no compute action"):
        sch.validate([[Action.parse("0F0")], [Action.parse("2F0")]])


def test_a_wide_grid_is_cut_to_a_window_around_the_fault():
    program, _ = _program("1f1b", 4, 32)
    _remove(program, "3RECV_F30")
    text = _fault(program)
    assert "[3F30]" in text and "shown)" in text
    assert max(len(line) for line in text.splitlines()) < 800
