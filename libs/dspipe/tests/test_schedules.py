"""Every generator, for p <= 8 ranks and m <= 32 micro-batches: validates as a lowered program, runs in
the simulator, and meets its closed form at equal op costs."""

import pytest

import dspipe.schedules as sch
from dspipe.schedules import Action, Costs, Kind, ScheduleError

RANKS = range(1, 9)
MICRO_BATCHES = range(1, 33)
DEFAULT = Costs()  # F=1, B=2, I=1, W=1, comm=0


def _bubble(name, p, m, chunks=None):
    """Validate the lowered program (its compute actions, their order, every message, that it finishes),
    then return the simulated compute schedule."""
    compute = sch.build_schedule(name, p, m, chunks)
    layout = sch.placement(name, p, chunks=chunks)
    sch.validate(sch.lower(compute, layout), layout)
    return sch.simulate(compute, DEFAULT)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "inference"])
def test_gpipe_1f1b_and_inference_bubble_is_p_minus_1_over_m(name):
    for p in RANKS:
        for m in MICRO_BATCHES:
            timeline = _bubble(name, p, m)
            assert timeline.bubble == pytest.approx((p - 1) / m), (name, p, m)


@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_interleaved_bubble_is_p_minus_1_over_vm(chunks):
    assert [{a.stage for a in ops} for ops in sch.interleaved_1f1b(3, 6, chunks)] == \
        [{r + k * 3 for k in range(chunks)} for r in range(3)]
    for p in RANKS:
        for m in MICRO_BATCHES:
            timeline = _bubble("interleaved_1f1b", p, m, chunks)
            if m >= p:  # fewer micro-batches than ranks cannot fill the interleaved rounds
                assert timeline.bubble == pytest.approx((p - 1) / (chunks * m)), (p, m, chunks)
            else:
                assert timeline.bubble <= (p - 1) / m + 1e-9, (p, m, chunks)


def test_zb_h1_bubble_is_a_third_of_1f1b_and_never_slower():
    for p in RANKS:
        for m in MICRO_BATCHES:
            timeline = _bubble("zb_h1", p, m)
            if m >= p:
                assert timeline.bubble == pytest.approx((p - 1) / (3 * m)), (p, m)
            else:  # the last micro-batch's chain: its F and I through every rank, after m F's and I's
                assert timeline.makespan == 2 * m + 2 * p - 1, (p, m)
            one_f_one_b = sch.simulate(sch.one_f_one_b(p, m), DEFAULT)
            assert timeline.makespan <= one_f_one_b.makespan, (p, m)
            uneven = Costs(forward=1.0, backward=2.5, input_grad=1.5, weight_grad=1.0)
            assert sch.simulate(sch.zb_h1(p, m), uneven).makespan <= sch.simulate(sch.one_f_one_b(p, m), uneven).makespan
            # activations awaiting their input gradient stay at 1F1B's bound; W trails by at most `rank`
            assert all(peak <= min(p, m) for peak in timeline.peak_activations), (p, m)


def test_zbv_places_two_stages_per_rank_in_a_v_and_halves_zb_h1_bubble():
    for p in RANKS:
        for m in MICRO_BATCHES:
            timeline = _bubble("zbv", p, m)
            schedule = sch.zbv(p, m)
            for r in range(p):
                assert {a.stage for a in schedule[r]} == {r, 2 * p - 1 - r}
            if m >= 2 * p - 1:
                assert timeline.bubble == pytest.approx((p - 1) / (6 * m)), (p, m)
                assert timeline.peak_activations == (2 * p,) * p  # 1F1B's first rank, in half stages
            else:
                assert timeline.bubble <= sch.simulate(sch.zb_h1(p, m)).bubble + 1e-9, (p, m)


def test_dualpipev_needs_2p_micro_batches_and_matches_zbv_bubble():
    for p in RANKS:
        for m in MICRO_BATCHES:
            if m < 2 * p:
                with pytest.raises(ScheduleError, match="micro_batches >= 2 \\* stages"):
                    sch.dualpipev(p, m)
                continue
            timeline = _bubble("dualpipev", p, m)
            assert timeline.bubble == pytest.approx((p - 1) / (6 * m)), (p, m)
            kinds = {a.kind for ops in sch.dualpipev(p, m) for a in ops}
            assert kinds == {Kind.F, Kind.B, Kind.I, Kind.W}


def test_1f1b_peak_activations_are_min_p_minus_r_and_m():
    for p in RANKS:
        for m in MICRO_BATCHES:
            peaks = sch.simulate(sch.one_f_one_b(p, m)).peak_activations
            assert peaks == tuple(min(p - r, m) for r in range(p)), (p, m)
            assert sch.simulate(sch.gpipe(p, m)).peak_activations == (m,) * p


def _deepspeed_train_order(stages, stage, micro_batches):
    """DeepSpeed's TrainSchedule, from its published rule: 2(m + p - 1) steps; at step t a stage of the
    same parity runs forward t//2 - stage//2, otherwise backward t//2 - p + (stage+1)//2 (even t) or
    (t-1)//2 - p + 1 + stage//2 (odd t); ids outside 0..m-1 are idle steps."""
    order = []
    for t in range(2 * (micro_batches + stages - 1)):
        if t % 2 == stage % 2:
            kind, mb = "F", t // 2 - stage // 2
        elif t % 2 == 0:
            kind, mb = "B", t // 2 - stages + (stage + 1) // 2
        else:
            kind, mb = "B", (t - 1) // 2 - stages + 1 + stage // 2
        if 0 <= mb < micro_batches:
            order.append((kind, mb))
    return order


def test_1f1b_order_equals_deepspeed_train_schedule():
    for p in RANKS:
        for m in MICRO_BATCHES:
            ours = sch.one_f_one_b(p, m)
            for r in range(p):
                assert [(a.kind.value, a.micro_batch) for a in ours[r]] == _deepspeed_train_order(p, r, m), (p, m, r)


def test_generators_are_lists_of_compute_actions_one_per_rank():
    for name in sch.SCHEDULES:
        p, m = 3, 6
        schedule = sch.build_schedule(name, p, m)
        assert len(schedule) == p
        assert all(isinstance(a, Action) and a.kind.is_compute for ops in schedule for a in ops)
        assert sch.is_training(name) == (name != "inference")


def test_lowering_adds_messages_only_across_ranks_and_ends_with_the_step():
    program = sch.lower(sch.one_f_one_b(2, 2), sch.placement("1f1b", 2))
    assert [str(a) for a in program[0]] == ["0LOAD0", "0F0", "0SEND_F0", "0LOAD1", "0F1", "0SEND_F1", "0RECV_B0",
                                            "0B0", "0RECV_B1", "0B1", "REDUCE_TIED", "0REDUCE_GRAD", "STEP"]
    assert [str(a) for a in program[1]] == ["1LOAD0", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1LOAD1", "1RECV_F1",
                                            "1F1", "1B1", "1SEND_B1", "REDUCE_TIED", "1REDUCE_GRAD", "STEP"]
    # V placement: stages 1 and 2 share the last rank, so nothing is sent between them; rank 0 loads once
    v = sch.lower(sch.zbv(2, 3), sch.placement("zbv", 2))
    assert not any(a.kind.is_comm and {a.stage, a.peer} == {1, 2} for a in v[1])
    assert [a.micro_batch for a in v[0] if a.kind is Kind.LOAD] == [0, 1, 2]
    # one rank: no message at all
    assert not any(a.kind.is_comm for a in sch.lower(sch.zb_h1(1, 4), sch.placement("zb_h1", 1))[0])
    inference = sch.lower(sch.inference(2, 2), sch.placement("inference", 2))
    assert not any(a.kind in (Kind.STEP, Kind.REDUCE_GRAD, Kind.REDUCE_TIED) for ops in inference for a in ops)


def test_lower_refuses_actions_off_their_placement():
    with pytest.raises(ScheduleError, match="belongs to rank 1"):
        sch.lower([[Action.parse("1F0")], []], sch.placement("1f1b", 2))
    with pytest.raises(ScheduleError, match="compute actions only"):
        sch.lower([[Action.parse("0SEND_F0")]], sch.placement("1f1b", 1))


def test_message_tags_pair_each_send_with_its_receive_and_nothing_else():
    program = sch.lower(sch.interleaved_1f1b(2, 4, 2), sch.placement("interleaved_1f1b", 2, chunks=2))
    sends = {sch.message_tag(a): a for ops in program for a in ops if a.kind.is_send}
    receives = {sch.message_tag(a): a for ops in program for a in ops if a.kind.is_recv}
    assert len(sends) == len([a for ops in program for a in ops if a.kind.is_send])  # unique
    assert sends.keys() == receives.keys()
    assert all(receives[tag] == send.matching() for tag, send in sends.items())
    with pytest.raises(ScheduleError, match="too large"):
        sch.message_tag(Action(Kind.SEND_F, 5000, 0))


def test_registry_names_placements_and_arguments():
    assert sch.schedule_name("1F1B") == "1f1b" == sch.schedule_name("one_f_one_b")
    assert sch.schedule_name("ZB-H1") == "zb_h1"
    with pytest.raises(ScheduleError, match="valid: gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv, dualpipev"):
        sch.schedule_name("pipedream")
    assert sch.placement("1f1b", 4).rank_of == (0, 1, 2, 3)
    assert sch.placement("interleaved_1f1b", 2, chunks=3).rank_of == (0, 1, 0, 1, 0, 1)
    assert sch.placement("zbv", 3).rank_of == (0, 1, 2, 2, 1, 0)
    assert sch.placement("dualpipev", 2).stages_of(0) == (0, 3)
    with pytest.raises(ScheduleError, match="stages must be 6"):
        sch.placement("zbv", 3, stages=3)
    with pytest.raises(ScheduleError, match="only interleaved_1f1b takes chunks"):
        sch.build_schedule("1f1b", 2, 4, chunks=2)
    assert sch.SCHEDULES["interleaved_1f1b"](2, 4, 3) == sch.build_schedule("interleaved", 2, 4, 3)
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ScheduleError, match="stages must be an int"):
            sch.one_f_one_b(bad, 4)
        with pytest.raises(ScheduleError, match="micro_batches must be an int"):
            sch.gpipe(2, bad)
    with pytest.raises(ScheduleError, match="chunks must be an int"):
        sch.interleaved_1f1b(2, 4, 0)


def test_action_text_round_trips_in_torch_form():
    assert str(Action(Kind.F, 2, 0)) == "2F0"
    assert str(Action(Kind.B, 1, 3)) == "1B3"
    assert Action.parse("0I1") == Action(Kind.I, 0, 1)
    assert Action.parse(" 0W1 ") == Action(Kind.W, 0, 1)
    samples = [Action(kind, 3, 12) for kind in Kind if kind not in (Kind.REDUCE_TIED, Kind.STEP, Kind.REDUCE_GRAD)]
    samples += [Action(Kind.REDUCE_GRAD, 7), Action(Kind.REDUCE_TIED), Action(Kind.STEP)]
    for action in samples:
        assert Action.parse(str(action)) == action
        assert hash(Action.parse(str(action))) == hash(action)
    for program in (sch.lower(sch.dualpipev(2, 4), sch.placement("dualpipev", 2))):
        assert [Action.parse(str(a)) for a in program] == program
    assert Action.parse("3SEND_F1").peer == 4 and Action.parse("3RECV_B1").peer == 4
    assert Action.parse("3SEND_B1").matching() == Action.parse("2RECV_B1")


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "-1F0", "2F0x", "STEP3", "1REDUCE_GRAD2", "2 F 0", "1" * 20 + "F0"])
def test_action_parse_refuses_malformed_text(text):
    with pytest.raises(ScheduleError):
        Action.parse(text)


def test_action_fields_are_checked():
    with pytest.raises(ScheduleError, match="micro_batch must be an int >= 0"):
        Action(Kind.F, 0)
    with pytest.raises(ScheduleError, match="stage must be an int >= 0"):
        Action(Kind.B, -1, 0)
    with pytest.raises(ScheduleError, match="STEP takes no stage"):
        Action(Kind.STEP, 0)
    with pytest.raises(ScheduleError, match=r"must be a dspipe\.schedules\.Kind"):
        Action("F", 0, 0)
