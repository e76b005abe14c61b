"""Schedules (DeepSpeed's (step, passes) lists, checked against the passes' contracts) and the memory
profile the scheduling passes plan with."""

import pytest
import torch
from torch import fx

from dscompile import WARMUP, DeepCompileError, default_schedule, profile_memory, validate_schedule
from dscompile.schedule import entry_at
from dsconfig import CompileConfig


def test_default_schedules_follow_the_reference():
    plain = CompileConfig(deepcompile=True)
    assert default_schedule(1, plain) == [(0, ("zero1_compile",))]
    assert default_schedule(2, plain) == [(0, ("zero2_compile",))]
    assert default_schedule(3, plain) == [(0, ("zero3_compile",)),
                                          (WARMUP, ("zero3_compile", "prefetch", "selective_gather"))]
    assert default_schedule(3, CompileConfig(deepcompile=True, offload_parameters=True)) == [
        (0, ("zero3_compile", "offload_parameters"))]
    assert default_schedule(3, CompileConfig(deepcompile=True, offload_opt_states=True)) == [
        (0, ("zero3_compile",)), (1, ("zero3_compile", "offload_adam_states"))]
    freeing = default_schedule(3, CompileConfig(deepcompile=True, free_activation=True))
    assert all(passes[-1] == "free_activation" for _, passes in freeing)
    long_context = default_schedule(2, CompileConfig(deepcompile=True, passes=["long_context_checkpointing"]))
    assert long_context == [(0, ("zero2_compile", "long_context_checkpointing"))]
    assert validate_schedule(long_context, 2) == long_context
    # activation offload runs only from a schedule that names it, as the reference says
    assert "offload_activation" not in str(default_schedule(3, CompileConfig(deepcompile=True,
                                                                             offload_activation=True)))


@pytest.mark.parametrize(("stage", "settings", "words"), [
    (2, {"offload_opt_states": True}, "compile.offload_opt_states needs zero_optimization.stage 3"),
    (1, {"offload_parameters": True}, "compile.offload_parameters needs zero_optimization.stage 3"),
    (0, {}, "stages 1, 2 and 3"),
])
def test_default_schedules_refuse_what_the_stage_cannot_do(stage, settings, words):
    with pytest.raises(DeepCompileError, match=words):
        default_schedule(stage, CompileConfig(deepcompile=True, **settings))


def _own_pass(graph, info):
    return graph


@pytest.mark.parametrize(("schedule", "words"), [
    ([], "non-empty list"),
    ("zero3_compile", "non-empty list"),
    ([(0,)], r"schedule\[0\].*pair"),
    ([(-1, ["zero3_compile"])], "non-negative int"),
    ([(True, ["zero3_compile"])], "non-negative int"),
    ([(0, ["zero3_compile"]), (0, ["zero3_compile"])], r"schedule\[1\]: step 0 must come after"),
    ([(2, ["zero3_compile"])], "first entry must be step 0"),
    ([(0, [])], "non-empty list of pass names"),
    ([(0, ["zero3_compile", "warp_speed"])], r"unknown pass 'warp_speed'; the passes are .*prefetch"),
    ([(0, ["prefetch"])], r"needs \['z3_gather_release'\]"),
    ([(0, ["zero3_compile", "offload_parameters", "offload_adam_states"])], "cannot share an entry"),
    ([(0, ["zero1_compile"])], "runs at ZeRO stage 1, not at stage 3"),
])
def test_bad_schedules_are_refused_naming_the_entry(schedule, words):
    with pytest.raises(DeepCompileError, match=words):
        validate_schedule(schedule, 3)


def test_zero3_pass_at_stage_1_points_to_the_right_one():
    with pytest.raises(DeepCompileError, match="use zero1_compile / zero2_compile"):
        validate_schedule([(0, ["zero3_compile"])], 1)


def test_a_valid_schedule_with_a_callable_and_its_entries_by_step():
    schedule = validate_schedule([(0, ["zero3_compile"]), (3, ["zero3_compile", "prefetch", _own_pass])], 3)
    assert schedule[1][1][-1] is _own_pass
    assert [entry_at(schedule, step) for step in range(5)] == [0, 0, 0, 1, 1]


def test_the_memory_profile_counts_allocations_frees_and_views():
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(10)  # 40 bytes held by the caller
    a = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    a.meta["val"] = torch.empty(10)
    view = graph.call_function(torch.ops.aten.view.default, (a, [2, 5]))
    view.meta["val"] = torch.empty(2, 5)
    b = graph.call_function(torch.ops.aten.add.Tensor, (view, 1))
    b.meta["val"] = torch.empty(2, 5)
    c = graph.call_function(torch.ops.aten.sum.default, (b,))
    c.meta["val"] = torch.empty(())
    graph.output((c,))
    profile = profile_memory(graph)
    # x | a allocated | view free | b allocated while a alive, a's last reader | c, b freed | output
    assert profile.live == [40, 80, 80, 80, 44, 44]
    assert profile.peak == [40, 80, 80, 120, 84, 44]
    assert profile.max_peak == 120 and profile.max_gathered == 0
