"""The Hybrid Engine's latency split, as DeepSpeed prints it at each `engine.eval()`: the end-to-end
time of the last iteration (eval() to eval()), the part spent gathering weights for generation,
generating, training (train() to each step()), and the rest; also to the monitors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...logs import log_on_rank0

EVENT_PREFIX = "Train/HybridEngine"


@dataclass
class LatencySplit:
    rank: int
    started: float | None = None  # the last eval()
    gather_s: float = 0.0
    generate_s: float = 0.0
    training_s: float = 0.0
    training_since: float | None = None  # the last train() or step() of this iteration
    iterations: int = 0
    total_s: float = 0.0
    samples_per_iteration: int | None = None  # generation batch over every data-parallel rank
    last: dict[str, float] = field(default_factory=dict)

    def generated(self, gather_s: float, generate_s: float, samples: int) -> None:
        self.gather_s += gather_s
        self.generate_s += generate_s
        if self.samples_per_iteration is None:
            self.samples_per_iteration = samples

    def training(self) -> None:
        self.training_since = time.perf_counter()

    def stepped(self) -> None:
        if self.training_since is not None:
            now = time.perf_counter()
            self.training_s += now - self.training_since
            self.training_since = now

    def evaluating(self) -> dict[str, float] | None:
        """At eval(): close the iteration that started at the previous eval(); its figures (or None at the first)."""
        now = time.perf_counter()
        figures = None
        if self.started is not None:
            latency = max(now - self.started, 1e-9)
            self.iterations += 1
            self.total_s += latency
            samples = self.samples_per_iteration or 0
            figures = {"e2e_latency_s": latency, "gather_latency_s": self.gather_s,
                       "generate_s": self.generate_s, "training_s": self.training_s,
                       "others_s": latency - self.gather_s - self.generate_s - self.training_s,
                       "samples_per_s": samples / latency,
                       "avg_samples_per_s": samples / (self.total_s / self.iterations)}
            self.last = figures
            log_on_rank0(self.rank, format_split(figures))
        self.started = now
        self.gather_s = self.generate_s = self.training_s = 0.0
        self.training_since = None
        return figures


def format_split(f: dict[str, float]) -> str:
    latency = f["e2e_latency_s"]

    def share(seconds: float) -> str:
        return f"{seconds:.2f}s ({seconds / latency * 100:.2f}%)"

    return (f"|E2E latency={latency:.2f}s |Gather latency={share(f['gather_latency_s'])} "
            f"|Generate time={share(f['generate_s'])} |Training time={share(f['training_s'])} "
            f"|Others={share(f['others_s'])} |CurSamplesPerSec={f['samples_per_s']:.2f} "
            f"|AvgSamplesPerSec={f['avg_samples_per_s']:.2f}")


def monitor_events(figures: dict[str, float], step: int) -> list[tuple[str, float, int]]:
    return [(f"{EVENT_PREFIX}/{name}", value, step) for name, value in figures.items()]
