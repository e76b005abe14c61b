"""When which passes run: a schedule is a list of (step, passes), as DeepSpeed's `schedule=`; from each
entry's optimizer step on, the graphs are compiled again from what torch.compile captured, with that
entry's passes in order. Later entries usually add passes that need a profile of the steps before them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsconfig import CompileConfig

from .errors import DeepCompileError
from .passes import REGISTRY

WARMUP = 5  # the reference's default: profile-driven passes join at this step

Entry = tuple[int, tuple[Any, ...]]


def default_schedule(stage: int, settings: CompileConfig) -> list[Entry]:
    """The reference's default schedules (init_z1_and_2 / init_z3), with free_activation added everywhere."""
    if stage in (1, 2):
        if settings.offload_opt_states:
            raise DeepCompileError(f"compile.offload_opt_states needs zero_optimization.stage 3 (stage is {stage}): "
                                   f"the opt-state offload pass schedules around ZeRO-3's graphs")
        if settings.offload_parameters:
            raise DeepCompileError(f"compile.offload_parameters needs zero_optimization.stage 3 (stage is {stage}): "
                                   f"only stage 3 partitions parameters")
        entries: list[tuple[int, list[str]]] = [(0, [f"zero{stage}_compile"])]
    elif stage == 3:
        if settings.offload_parameters:
            entries = [(0, ["zero3_compile", "offload_parameters"])]
        elif settings.offload_opt_states:
            # The states exist once the first step has run, so moving them starts at step 1.
            entries = [(0, ["zero3_compile"]), (1, ["zero3_compile", "offload_adam_states"])]
        else:
            entries = [(0, ["zero3_compile"]), (WARMUP, ["zero3_compile", "prefetch", "selective_gather"])]
    else:
        raise DeepCompileError(f"DeepCompile schedules ZeRO stages 1, 2 and 3; zero_optimization.stage is {stage}")
    if settings.free_activation:
        entries = [(step, [*names, "free_activation"]) for step, names in entries]
    if "long_context_checkpointing" in settings.passes:
        entries = [(step, [*names, "long_context_checkpointing"]) for step, names in entries]
    return [(step, tuple(names)) for step, names in entries]


def _name(item: Any) -> str:
    return item if isinstance(item, str) else getattr(item, "__name__", repr(item))


def validate_schedule(schedule: Any, stage: int) -> list[Entry]:
    """The schedule as [(step, (pass, ...))], or DeepCompileError naming the entry and what is wrong."""
    if not isinstance(schedule, Sequence) or isinstance(schedule, (str, bytes)) or not schedule:
        raise DeepCompileError(f"schedule must be a non-empty list of (step, [passes]) pairs, got {schedule!r:.200}")
    known = ", ".join(sorted(name for name, p in REGISTRY.items() if stage in p.stages))
    result: list[Entry] = []
    for index, entry in enumerate(schedule):
        where = f"schedule[{index}]"
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise DeepCompileError(f"{where} = {entry!r:.200}: each entry is a (step, [passes]) pair")
        step, passes = entry
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise DeepCompileError(f"{where}: step {step!r:.50} must be a non-negative int (an optimizer step)")
        if result and step <= result[-1][0]:
            raise DeepCompileError(f"{where}: step {step} must come after the previous entry's step {result[-1][0]}")
        if not isinstance(passes, (list, tuple)) or not passes:
            raise DeepCompileError(f"{where}: passes must be a non-empty list of pass names or callables")
        provided: set[str] = set()
        applied: list[str] = []
        for item in passes:
            if callable(item) and not isinstance(item, str):
                applied.append(_name(item))  # a user's own pass: requires and provides nothing
                continue
            if not isinstance(item, str) or item not in REGISTRY:
                raise DeepCompileError(f"{where}: unknown pass {item!r:.80}; the passes are {known} (or a callable "
                                       f"(graph, GraphInfo) -> graph)")
            spec = REGISTRY[item]
            if stage not in spec.stages:
                allowed = " or ".join(str(s) for s in sorted(spec.stages))
                raise DeepCompileError(f"{where}: pass {item!r} runs at ZeRO stage {allowed}, not at stage {stage}"
                                       + ("; use zero1_compile / zero2_compile at stages 1-2"
                                          if item == "zero3_compile" else ""))
            missing = spec.requires - provided
            if missing:
                raise DeepCompileError(f"{where}: pass {item!r} needs {sorted(missing)} from an earlier pass of the "
                                       f"same entry (zero3_compile); passes so far: {applied}")
            clash = [name for name in applied if name in spec.conflicts
                     or item in REGISTRY.get(name, REGISTRY[item]).conflicts]
            if clash:
                raise DeepCompileError(f"{where}: pass {item!r} cannot share an entry with {clash}: one offloading "
                                       f"target per run")
            provided |= spec.provides
            applied.append(item)
        result.append((step, tuple(passes)))
    if result[0][0] != 0:
        raise DeepCompileError(f"schedule[0] starts at step {result[0][0]}: the first entry must be step 0, so the "
                               f"first steps are compiled too")
    return result


def entry_at(schedule: list[Entry], step: int) -> int:
    """The index of the entry in force at optimizer step `step`."""
    index = 0
    for i, (start, _) in enumerate(schedule):
        if start <= step:
            index = i
    return index


def names_in(schedule: list[Entry]) -> set[str]:
    return {item for _, passes in schedule for item in passes if isinstance(item, str)}
