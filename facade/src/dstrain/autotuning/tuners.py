"""The order in which a stage's points are tried, and when to stop (tuner_type, tuner_num_trials,
tuner_early_stopping).

- gridsearch: the points in grid order;
- random: a seeded shuffle of them;
- model_based: two spread-out points first, then, each time, the point a cost model fitted on
  everything measured so far predicts best (now and then a random one, so a wrong model cannot trap
  the search).

A search stops after `num_trials` experiments, when every point has been tried, or `early_stopping`
experiments after the best one found so far (before any success, counting from the start). Pure:
`evaluate(index)` returns the metric or None for a failed experiment.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import ranking
from .cost_model import QuadraticModel

TUNERS = ("gridsearch", "random", "model_based")


@dataclass(frozen=True)
class Trial:
    index: int  # into the points
    value: float | None  # the metric; None when the experiment failed


@dataclass
class Exploration:
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    stopped_early: bool = False

    @property
    def best_position(self) -> int | None:
        """1-based number of the trial that found the best (how many experiments it took)."""
        return self.trials.index(self.best) + 1 if self.best is not None else None


class GridSearch:
    def __init__(self, count: int) -> None:
        self.order = list(range(count))

    def next(self, visited: set[int], trials: Sequence[Trial]) -> int | None:
        return next((i for i in self.order if i not in visited), None)


class RandomSearch(GridSearch):
    def __init__(self, count: int, seed: int = 0) -> None:
        super().__init__(count)
        random.Random(seed).shuffle(self.order)


class ModelBased:
    INITIAL = 2
    EXPLORE = 0.1  # share of picks made at random

    def __init__(self, rows: Sequence[Sequence[float]], metric: str, seed: int = 0) -> None:
        self.rows = [list(r) for r in rows]
        self.metric = metric
        self.rng = random.Random(seed)
        self.model = QuadraticModel()

    def next(self, visited: set[int], trials: Sequence[Trial]) -> int | None:
        unvisited = [i for i in range(len(self.rows)) if i not in visited]
        if not unvisited:
            return None
        if not trials:
            return unvisited[0]
        if len(trials) < self.INITIAL:
            return max(unvisited, key=lambda i: (min(_distance(self.rows[i], self.rows[t.index]) for t in trials), -i))
        if self.rng.random() < self.EXPLORE:
            return self.rng.choice(unvisited)
        self.model.fit([self.rows[t.index] for t in trials], [ranking.score(self.metric, t.value) for t in trials])
        predicted = self.model.predict([self.rows[i] for i in unvisited])
        return max(zip(predicted, unvisited), key=lambda pair: (pair[0], -pair[1]))[1]


def _distance(a: Sequence[float], b: Sequence[float]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b))


def make_tuner(kind: str, count: int, *, rows: Sequence[Sequence[float]] | None = None, metric: str = "throughput",
               seed: int = 0):
    if kind == "gridsearch":
        return GridSearch(count)
    if kind == "random":
        return RandomSearch(count, seed)
    if kind == "model_based":
        return ModelBased(rows if rows is not None else [[] for _ in range(count)], metric, seed)
    raise ValueError(f"autotuning.tuner_type = {kind!r}: must be one of {', '.join(TUNERS)}")


def explore(count: int, evaluate: Callable[[int], float | None], *, tuner: str, metric: str, num_trials: int,
            early_stopping: int | None, rows: Sequence[Sequence[float]] | None = None, seed: int = 0) -> Exploration:
    """Try points 0..count-1 in the tuner's order until a stopping rule holds."""
    order = make_tuner(tuner, count, rows=rows, metric=metric, seed=seed)
    result = Exploration()
    visited: set[int] = set()
    best_at = -1  # position of the best trial; -1 before any success
    while len(result.trials) < num_trials:
        index = order.next(visited, result.trials)
        if index is None:
            break
        visited.add(index)
        trial = Trial(index, evaluate(index))
        result.trials.append(trial)
        if ranking.better(metric, trial.value, result.best.value if result.best else None):
            result.best, best_at = trial, len(result.trials) - 1
        if early_stopping and len(result.trials) - 1 - best_at >= early_stopping and len(visited) < count \
                and len(result.trials) < num_trials:
            result.stopped_early = True
            break
    return result
