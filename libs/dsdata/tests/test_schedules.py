"""The pacing functions against sequences computed by hand, DeepSpeed's golden ones included, and
CurriculumScheduler's methods."""

import pytest

import dsconfig
from dsdata import (
    CurriculumScheduler,
    DataEfficiencyError,
    fixed_discrete,
    fixed_linear,
    fixed_root,
    make_schedule,
)


def test_deepspeed_golden_fixed_discrete():
    got = [fixed_discrete(step, difficulty=[1, 2, 3, 4, 5], max_step=[2, 4, 6, 8]) for step in range(1, 12)]
    assert got == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5]


def test_deepspeed_golden_fixed_linear():
    got = [fixed_linear(step, min_difficulty=2, max_difficulty=10, total_curriculum_step=8, difficulty_step=2)
           for step in range(1, 11)]
    assert got == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]


def test_fixed_root_by_hand():
    # 8 + 56 * sqrt(step / 100), rounded down to a multiple of 8, at most 64:
    # 0 -> 8; 1 -> 13.6 -> 8; 25 -> 36 -> 32; 50 -> 47.6 -> 40; 81 -> 58.4 -> 56; 100 -> 64; 400 -> 120 -> 64
    steps = [0, 1, 25, 50, 81, 100, 400]
    got = [fixed_root(s, min_difficulty=8, max_difficulty=64, total_curriculum_step=100, difficulty_step=8,
                      root_degree=2) for s in steps]
    assert got == [8, 8, 32, 40, 56, 64, 64]


def test_fixed_root_of_degree_one_is_fixed_linear():
    for step in range(0, 30):
        kwargs = dict(min_difficulty=5, max_difficulty=77, total_curriculum_step=20, difficulty_step=4)
        assert fixed_root(step, root_degree=1, **kwargs) == fixed_linear(step, **kwargs)


def test_rounding_never_drops_below_min_difficulty():
    # min 3, step 2: 3 + step, rounded down to even; DeepSpeed's step 0 gives 2, below the minimum.
    got = [fixed_linear(s, min_difficulty=3, max_difficulty=11, total_curriculum_step=8, difficulty_step=2)
           for s in range(10)]
    assert got == [3, 4, 4, 6, 6, 8, 8, 10, 10, 11]
    assert min(got) == 3


def test_make_schedule_checks_the_numbers():
    with pytest.raises(DataEfficiencyError, match="difficulty_step"):
        make_schedule("fixed_linear", min_difficulty=1, max_difficulty=9, schedule_config={"total_curriculum_step": 5})
    with pytest.raises(DataEfficiencyError, match="one more difficulty"):
        make_schedule("fixed_discrete", min_difficulty=1, max_difficulty=3,
                      schedule_config={"difficulty": [1, 2, 3], "max_step": [4]})
    with pytest.raises(DataEfficiencyError, match="increase strictly"):
        make_schedule("fixed_discrete", min_difficulty=1, max_difficulty=3,
                      schedule_config={"difficulty": [1, 2, 3], "max_step": [4, 4]})
    with pytest.raises(DataEfficiencyError, match="must not exceed"):
        make_schedule("fixed_root", min_difficulty=9, max_difficulty=3, schedule_config={})
    with pytest.raises(DataEfficiencyError, match="not one of"):
        make_schedule("fixed_cubic", min_difficulty=1, max_difficulty=3, schedule_config={})


LINEAR = {"min_difficulty": 2, "max_difficulty": 10, "schedule_type": "fixed_linear",
          "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 2}}


def test_scheduler_follows_the_schedule_and_freezes_at_the_maximum():
    scheduler = CurriculumScheduler(LINEAR)
    assert scheduler.get_current_difficulty() == 2
    assert [scheduler.update_difficulty(s) for s in range(1, 11)] == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]
    assert scheduler.get_difficulty(3) == 4 and scheduler.get_current_difficulty() == 10  # get_difficulty is pure


def test_a_custom_schedule_is_called_with_the_step_and_frozen_once_at_the_maximum():
    scheduler = CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 50, "schedule_type": "custom"})
    with pytest.raises(DataEfficiencyError, match="set_custom_curriculum_learning_schedule"):
        scheduler.update_difficulty(1)
    seen = []
    scheduler.set_custom_get_difficulty(lambda step: seen.append(step) or (50 if step == 3 else step))
    assert [scheduler.update_difficulty(s) for s in (1, 2, 3, 4, 5)] == [1, 2, 50, 50, 50]
    assert seen == [1, 2, 3]  # not asked again once at the maximum


def test_state_round_trip_and_dsconfig_sections():
    scheduler = CurriculumScheduler(LINEAR)
    scheduler.update_difficulty(5)
    other = CurriculumScheduler(LINEAR)
    other.set_state(scheduler.get_state())
    assert other.get_current_difficulty() == 6
    scheduler.set_current_difficulty(9)
    assert other.get_current_difficulty() == 6  # get_state() is a copy
    cfg = dsconfig.load({"train_batch_size": 1, "data_efficiency": {"data_sampling": {"curriculum_learning": {
        "curriculum_metrics": {"seqlen": {"clustering_type": "single_cluster", **LINEAR}}}}}})
    metric = cfg.data_efficiency.data_sampling.curriculum_learning.curriculum_metrics["seqlen"]
    from_section = CurriculumScheduler(metric)
    assert [from_section.update_difficulty(s) for s in range(1, 6)] == [2, 4, 4, 6, 6]


def test_missing_keys_are_named():
    with pytest.raises(DataEfficiencyError, match="max_difficulty"):
        CurriculumScheduler({"min_difficulty": 1, "schedule_type": "fixed_linear"})
    with pytest.raises(DataEfficiencyError, match=r"curriculum_learning\.schedule_config\.total_curriculum_step"):
        CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 5, "schedule_type": "fixed_root",
                             "schedule_config": {"difficulty_step": 1, "root_degree": 2}})
