"""DeepSpeed's step-wise schedules (`dspipe.schedules.steps`): the exact steps of small cases, written out."""

import pytest

from dspipe.errors import ScheduleError
from dspipe.schedules.steps import (
    BackwardPass,
    DataParallelSchedule,
    ForwardPass,
    InferenceSchedule,
    LoadMicroBatch,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ReduceGrads,
    ReduceTiedGrads,
    SendActivation,
    SendGrad,
    TrainSchedule,
)

END = [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]


def test_two_stage_1f1b_steps_of_each_stage():
    first = list(TrainSchedule(micro_batches=2, stages=2, stage_id=0))
    assert first == [
        [LoadMicroBatch(0), ForwardPass(0)],
        [SendActivation(0)],  # stage 1 receives it at the same step
        [LoadMicroBatch(1), ForwardPass(1)],
        [RecvGrad(0), SendActivation(1), BackwardPass(0)],
        [],
        [RecvGrad(1), BackwardPass(1), *END],
    ]
    last = list(TrainSchedule(micro_batches=2, stages=2, stage_id=1))
    assert last == [
        [],
        [RecvActivation(0), LoadMicroBatch(0), ForwardPass(0)],
        [BackwardPass(0)],
        [SendGrad(0), RecvActivation(1), LoadMicroBatch(1), ForwardPass(1)],
        [BackwardPass(1)],
        [SendGrad(1), *END],
    ]
    assert TrainSchedule(micro_batches=8, stages=4, stage_id=0).num_pipe_buffers() == 4
    assert TrainSchedule(micro_batches=8, stages=4, stage_id=3).num_pipe_buffers() == 2


def test_inference_alternates_two_buffers_and_every_micro_batch_is_forwarded_once_per_stage():
    mid = list(InferenceSchedule(micro_batches=3, stages=3, stage_id=1))
    assert mid == [[], [RecvActivation(0), ForwardPass(0)], [RecvActivation(1), SendActivation(0), ForwardPass(1)],
                   [RecvActivation(0), SendActivation(1), ForwardPass(0)], [SendActivation(0)]]
    for stage in range(3):
        steps = list(InferenceSchedule(micro_batches=5, stages=3, stage_id=stage))
        assert sum(isinstance(c, ForwardPass) for step in steps for c in step) == 5
    assert [len(s) for s in DataParallelSchedule(micro_batches=2, stages=1, stage_id=0)] == [3, 5]


def test_a_schedule_iterates_again_from_the_start():
    sched = TrainSchedule(micro_batches=3, stages=2, stage_id=0)
    assert list(sched) == list(sched) and sched.is_first_stage and not sched.is_last_stage


@pytest.mark.parametrize("args", [dict(micro_batches=0, stages=2, stage_id=0), dict(micro_batches=2, stages=2, stage_id=2),
                                  dict(micro_batches=2, stages=True, stage_id=0), dict(micro_batches=2, stages=2, stage_id=-1)])
def test_counts_out_of_range_are_refused(args):
    with pytest.raises(ScheduleError):
        TrainSchedule(**args)
