"""The search over ZeRO stages, micro-batches and knobs, given a function that runs one experiment.

For each stage, in order:
1. the memory estimate (dszero's estimators plus the activation memory the first experiment measured)
   rules out the micro-batches that cannot fit, so they are never launched; a stage where not even
   the smallest fits is skipped;
2. the memory probe: the largest micro-batch the batch limits and the estimate allow is run; if it
   fails, a bisection between it and the smallest finds the largest that runs (a user's list of
   micro-batches is taken as it is instead);
3. the stage's points (tuning micro-batches x knob values) are explored by the tuner, within
   tuner_num_trials and tuner_early_stopping.
Experiments that fail (out of memory, a crash, a timeout) are recorded and skipped. When the stages
were not chosen by the user, a stage that neither ran faster nor fit a larger micro-batch than the
stages below it ends the search: higher stages only save more memory at more communication.

`evaluate(point)` returns an Outcome; the search is tested with synthetic ones, without processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsconfig import AUTO

from . import memory, ranking
from .batches import tuning_micro_batches
from .configs import config_problems, experiment_config
from .memory import ModelInfo
from .request import TuningRequest
from .space import OFFLOAD_SECTIONS, Point, features, knob_dimensions, stage_points, unread_lists
from .tuners import Exploration, explore

FAILURES = ("oom", "crash", "timeout", "no-metrics")


@dataclass
class Outcome:
    status: str  # "ok" or one of FAILURES
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0
    reused: bool = False  # read from an earlier session's results (autotuning.overwrite false)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Record:
    point: Point
    outcome: Outcome
    role: str  # "probe" (finding the largest micro-batch that runs) or "tuning"

    def value(self, metric: str) -> float | None:
        value = self.outcome.metrics.get(metric) if self.outcome.ok else None
        return float(value) if isinstance(value, (int, float)) and value > 0 else None


@dataclass
class Progress:
    """Handed to the progress callback after each experiment."""

    record: Record
    number: int  # experiments so far in this session (reused ones included)
    left: int  # about how many more (an upper bound: early stopping may end a stage sooner)
    elapsed: float  # seconds since the search began
    seconds_per_run: float  # mean duration of the experiments actually run
    best: Record | None


@dataclass
class SearchResult:
    metric: str
    records: list[Record] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    explorations: dict[str, Exploration] = field(default_factory=dict)
    seconds: float = 0.0

    def ranked(self) -> list[Record]:
        return ranking.ranked(self.records, self.metric, lambda r: r.value(self.metric), lambda r: r.point.name)

    @property
    def best(self) -> Record | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def spaces(self) -> list[str]:
        return list(dict.fromkeys(r.point.space for r in self.records))


class Search:
    def __init__(self, request: TuningRequest, evaluate: Callable[[Point], Outcome], *,
                 progress: Callable[[Progress], None] | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.request = request
        self.settings = request.settings
        self.evaluate = evaluate
        self.progress = progress
        self.seed = seed
        self.clock = clock
        self.result = SearchResult(request.metric)
        self.info: ModelInfo | None = None
        self._cache: dict[str, Record] = {}
        self._began = clock()
        self._run_seconds: list[float] = []
        self._stage_left: int | None = None  # experiments left in the stage being explored
        self._checked: dict[str, list] = {}
        self._current = 0  # position of the stage being tuned

    # ------------------------------------------------------------------ the whole search
    def run(self) -> SearchResult:
        best: Record | None = None
        largest_below = 0
        for position, stage in enumerate(self.request.stages):
            self._current = position
            found = self._tune_stage(stage)
            if found is None:
                continue
            stage_best, largest = found
            metric = self.request.metric
            helped = best is None or ranking.better(metric, stage_best.value(metric) if stage_best else None,
                                                    best.value(metric))
            if not self.request.stages_chosen and best is not None and stage_best is not None and not helped \
                    and largest <= largest_below:
                rest = self.request.stages[position + 1:]
                if rest:
                    self.result.notes.append(
                        f"z{stage} ran no faster and fit no larger micro-batch than the stages below it; stages "
                        f"{', '.join(map(str, rest))} (which only save more memory) were not tuned. List the stages "
                        f"in zero_optimization.stage to tune them anyway")
                    break
            if stage_best is not None and helped:
                best = stage_best
            largest_below = max(largest_below, largest)
        self.result.seconds = self.clock() - self._began
        return self.result

    # ------------------------------------------------------------------ one stage
    def _tune_stage(self, stage: int) -> tuple[Record | None, int] | None:
        req, limits = self.request, self.request.limits
        self._stage_left = None
        listed = [m for m in req.micro_batches if limits.triple(m)] if req.micro_batches else None
        if req.micro_batches and len(listed) < len(req.micro_batches):
            self._note(f"z{stage}: micro-batch(es) {sorted(set(req.micro_batches) - set(listed))} skipped: no batch "
                       f"triple within the limits ({self._limits_text()})")
        runnable = listed if listed is not None else limits.allowed(req.min_micro_batch, limits.largest_micro_batch())
        if not runnable:
            self._note(f"z{stage}: no micro-batch to try within the limits ({self._limits_text()})")
            return None
        low = runnable[0]
        if self.info is None:  # the model-information run: the smallest point of the first stage
            first = self._run(self._base(stage, low, self._dims(stage)), "probe")
            if (first is None or not first.outcome.ok) and listed is None:
                reason = first.outcome.reason if first else "the config check refuses every point"
                self._note(f"z{stage}: does not run at micro-batch {low}: {reason}")
                return None
        dims = self._dims(stage)  # with the model's size known, equivalent bucket sizes collapse
        unread = unread_lists(stage, req.zero_section) if not self.settings.fast else []
        if unread:
            self._note(f"z{stage}: {', '.join(unread)} not tuned: dszero does not read them at this stage (their "
                       f"first value is used)")
        fit = self._fit(stage)
        if fit is not None and fit < low:
            self._note(f"z{stage}: not launched: micro-batch {low} does not fit: {self._describe(stage, low)}")
            return None
        if listed is not None:
            over = [m for m in listed if fit is not None and m > fit]
            if over:
                self._note(f"z{stage}: micro-batch(es) {over} not launched: {self._describe(stage, over[0])}")
            micro_batches = [m for m in listed if m not in over]
        else:
            high = runnable[-1]
            if fit is not None and fit < high:
                self._note(f"z{stage}: micro-batches above {fit} not launched: {self._describe(stage, fit + 1)}")
                high = fit
            largest = self._largest_runnable(stage, low, high, dims)
            if largest is None:
                return None
            micro_batches = tuning_micro_batches(limits, low, largest, self.settings.num_tuning_micro_batch_sizes)
        if not micro_batches:
            self._note(f"z{stage}: no micro-batch to try")
            return None
        points = [p for p in stage_points(stage, [limits.triple(m) for m in micro_batches], dims) if self._valid(p)]
        if not points:
            return None
        self._stage_left = min(self.settings.tuner_num_trials, len(points))

        def trial(index: int) -> float | None:
            record = self._run(points[index], "tuning")
            if self._stage_left:
                self._stage_left -= 1
            return record.value(req.metric) if record else None

        exploration = explore(len(points), trial, tuner=self.settings.tuner_type, metric=req.metric,
                              num_trials=self.settings.tuner_num_trials,
                              early_stopping=self.settings.tuner_early_stopping, rows=features(points), seed=self.seed)
        self._stage_left = None
        self.result.explorations[f"z{stage}"] = exploration
        if exploration.stopped_early:
            self._note(f"z{stage}: stopped after {len(exploration.trials)} of {len(points)} point(s): no better one in "
                       f"the last {self.settings.tuner_early_stopping} (tuner_early_stopping)")
        in_stage = [r for r in self.result.records if r.point.stage == stage]
        ranked = ranking.ranked(in_stage, req.metric, lambda r: r.value(req.metric), lambda r: r.point.name)
        ran = [r.point.micro_batch for r in in_stage if r.outcome.ok]
        return (ranked[0] if ranked else None), max(ran, default=0)

    def _largest_runnable(self, stage: int, low: int, high: int, dims: dict) -> int | None:
        """The memory probe: the largest micro-batch in [low, high] that runs at `stage` (None: not even low)."""
        candidates = self.request.limits.allowed(low, high)
        if not candidates:
            self._note(f"z{stage}: no micro-batch between {low} and {high} within the limits ({self._limits_text()})")
            return None
        top = self._run(self._base(stage, candidates[-1], dims), "probe")
        if top is not None and top.outcome.ok:
            return candidates[-1]
        good, bad = -1, len(candidates) - 1  # positions: good runs (or -1), bad does not
        while bad - good > 1:
            mid = (good + bad) // 2
            record = self._run(self._base(stage, candidates[mid], dims), "probe")
            if record is not None and record.outcome.ok:
                good = mid
            else:
                bad = mid
        if good < 0:
            self._note(f"z{stage}: not even micro-batch {candidates[0]} runs "
                       f"({self._cache_reason(stage, candidates[0], dims)})")
            return None
        if good < len(candidates) - 1:
            self._note(f"z{stage}: the largest micro-batch that runs is {candidates[good]} "
                       f"({candidates[good + 1]} failed: {self._cache_reason(stage, candidates[good + 1], dims)})")
        return candidates[good]

    # ------------------------------------------------------------------ helpers
    def _dims(self, stage: int) -> dict:
        return knob_dimensions(stage, self.request.zero_section, fast=self.settings.fast,
                               num_params=self.info.num_params if self.info else None)

    def _base(self, stage: int, micro_batch: int, dims: dict) -> Point | None:
        """The probes' point at `micro_batch`: the first in grid order the config check lets through."""
        points = stage_points(stage, [self.request.limits.triple(micro_batch)], dims)
        return next((p for p in points if self._valid(p)), None)

    def _offloads(self, stage: int) -> dict[str, bool]:
        zero = self.request.zero_section
        found = {}
        for section, lowest in OFFLOAD_SECTIONS.items():
            offload = zero.get(section)
            device = offload.get("device", "none") if isinstance(offload, dict) else "none"
            device = device[0] if isinstance(device, list) and device else device  # a list: its first is the base
            found[section] = stage >= lowest and device not in (None, "none", AUTO)
        return found

    def _fit(self, stage: int) -> int | None:
        if self.info is None:
            return None
        return memory.largest_fitting_micro_batch(stage, self.info, self.request.data_parallel, **self._offloads(stage))

    def _describe(self, stage: int, micro_batch: int) -> str:
        return memory.describe(stage, self.info, self.request.data_parallel, micro_batch, **self._offloads(stage))

    def _limits_text(self) -> str:
        lim = self.request.limits
        parts = [f"data-parallel size {lim.data_parallel}"]
        if lim.train_batch_size is not None:
            parts.append(f"train_batch_size {lim.train_batch_size}")
        if lim.max_train_batch_size is not None:
            parts.append(f"max_train_batch_size {lim.max_train_batch_size}")
        return ", ".join(parts)

    def _valid(self, point: Point) -> bool:
        if point.name not in self._checked:
            self._checked[point.name] = config_problems(experiment_config(self.request.raw, point),
                                                        self.request.data_parallel)
            if self._checked[point.name]:
                self._note(f"{point.name}: not launched, the config check refuses it: "
                           + "; ".join(map(str, self._checked[point.name])))
        return not self._checked[point.name]

    def _cache_reason(self, stage: int, micro_batch: int, dims: dict) -> str:
        point = self._base(stage, micro_batch, dims)
        record = self._cache.get(point.name) if point else None
        return f"{record.outcome.status}: {record.outcome.reason}" if record else "not run"

    def _note(self, text: str) -> None:
        self.result.notes.append(text)

    def _run(self, point: Point | None, role: str) -> Record | None:
        """The point's record, run once per session; None when the config check refuses the point."""
        if point is None:
            return None
        if point.name in self._cache:
            return self._cache[point.name]
        if not self._valid(point):
            return None
        outcome = self.evaluate(point)
        record = Record(point, outcome, role)
        self._cache[point.name] = record
        self.result.records.append(record)
        if self.info is None and outcome.ok:
            self.info = ModelInfo.from_metrics(outcome.metrics)
        if not outcome.reused:
            self._run_seconds.append(outcome.seconds)
        if self.progress is not None:
            mean = sum(self._run_seconds) / len(self._run_seconds) if self._run_seconds else 0.0
            self.progress(Progress(record, len(self.result.records), self._left(), self.clock() - self._began, mean,
                                   self.result.best))
        return record

    def _left(self) -> int:
        """About how many experiments are still to come: the rest of this stage's exploration (or, while it
        is still being probed, its estimate less what it ran) and the estimate of each stage after it."""
        stages = self.request.stages
        current = stages[self._current]
        if self._stage_left is not None:
            left = max(self._stage_left - 1, 0)
        else:
            ran = sum(1 for r in self.result.records if r.point.stage == current)
            left = max(self._stage_estimate(current) - ran, 0)
        return left + sum(self._stage_estimate(stage) for stage in stages[self._current + 1:])

    def _stage_estimate(self, stage: int) -> int:
        combos = 1
        for values in self._dims(stage).values():
            combos *= len(values)
        micro = len(self.request.micro_batches or ()) or self.settings.num_tuning_micro_batch_sizes
        return min(self.settings.tuner_num_trials, micro * combos) + (0 if self.request.micro_batches else 1)
