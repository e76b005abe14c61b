"""Schedules by name, with the placement each one runs on.

Names: gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv, dualpipev, inference (also accepted: any case, '-'
for '_', one_f_one_b, interleaved, zbh1). `stages` is always the pipeline's depth in ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ScheduleError
from ._checks import check_count
from .action import Schedule
from .dualpipev import dualpipev
from .generators import gpipe, inference, interleaved_1f1b, one_f_one_b
from .placement import Placement, make_placement
from .zero_bubble import zb_h1, zbv


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule generator and its shape: "loop" or "v" placement, and how many stages each rank holds
    (None: the `chunks` argument says)."""

    generate: Callable[..., Schedule]
    shape: str
    stages_per_rank: int | None
    training: bool = True


_SPECS: dict[str, ScheduleSpec] = {
    "gpipe": ScheduleSpec(gpipe, "loop", 1),
    "1f1b": ScheduleSpec(one_f_one_b, "loop", 1),
    "interleaved_1f1b": ScheduleSpec(interleaved_1f1b, "loop", None),
    "zb_h1": ScheduleSpec(zb_h1, "loop", 1),
    "zbv": ScheduleSpec(zbv, "v", 2),
    "dualpipev": ScheduleSpec(dualpipev, "v", 2),
    "inference": ScheduleSpec(inference, "loop", 1, training=False),
}
# name -> generator, f(stages, micro_batches[, chunks]) -> one list of compute actions per rank
SCHEDULES: dict[str, Callable[..., Schedule]] = {name: spec.generate for name, spec in _SPECS.items()}
_ALIASES = {"one_f_one_b": "1f1b", "interleaved": "interleaved_1f1b", "interleaved1f1b": "interleaved_1f1b",
            "zbh1": "zb_h1", "zb_v": "zbv", "dualpipe_v": "dualpipev"}
DEFAULT_CHUNKS = 2


def schedule_name(name: str) -> str:
    """The canonical name of `name` ("1F1B" -> "1f1b", "zb-h1" -> "zb_h1"), or a ScheduleError listing them."""
    if not isinstance(name, str):
        raise ScheduleError(f"a schedule name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _SPECS:
        raise ScheduleError(f"unknown pipeline schedule {name[:40]!r}; valid: {', '.join(SCHEDULES)}")
    return key


def stages_per_rank(name: str, chunks: int | None = None) -> int:
    """How many stages each rank holds under schedule `name` (interleaved_1f1b: `chunks`, default 2)."""
    key = schedule_name(name)
    fixed = _SPECS[key].stages_per_rank
    if fixed is None:
        return check_count("chunks", DEFAULT_CHUNKS if chunks is None else chunks, maximum=64)
    if chunks is not None and chunks != fixed:
        raise ScheduleError(f"schedule {key} holds {fixed} stage(s) per rank; chunks={chunks} does not apply "
                            f"(only interleaved_1f1b takes chunks)")
    return fixed


def is_training(name: str) -> bool:
    return _SPECS[schedule_name(name)].training


def build_schedule(name: str, stages: int, micro_batches: int, chunks: int | None = None) -> Schedule:
    """`SCHEDULES[name](stages, micro_batches[, chunks])`, with `chunks` checked against the schedule."""
    key = schedule_name(name)
    per_rank = stages_per_rank(key, chunks)
    if _SPECS[key].stages_per_rank is None:
        return _SPECS[key].generate(stages, micro_batches, per_rank)
    return _SPECS[key].generate(stages, micro_batches)


def placement(name: str, ranks: int, stages: int | None = None, chunks: int | None = None) -> Placement:
    """Which rank holds which stage under schedule `name` with `ranks` pipeline ranks and `stages` model
    stages in all (default: ranks x the schedule's stages per rank)."""
    key = schedule_name(name)
    check_count("ranks", ranks, maximum=4096)
    if stages is None:
        stages = ranks * stages_per_rank(key, chunks)
    elif _SPECS[key].stages_per_rank is not None and stages != ranks * _SPECS[key].stages_per_rank:
        raise ScheduleError(f"schedule {key} puts {_SPECS[key].stages_per_rank} stage(s) on each rank: with "
                            f"{ranks} ranks, stages must be {ranks * _SPECS[key].stages_per_rank}, got {stages}")
    return make_placement(_SPECS[key].shape, ranks, stages)
