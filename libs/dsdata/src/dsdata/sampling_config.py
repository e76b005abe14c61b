"""The data-sampling settings the sampler needs, read from a dsconfig `DataEfficiencyConfig` or from
DeepSpeed's plain dict of the `data_efficiency` section, into one flat, checked form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .curriculum_scheduler import config_as_dict
from .errors import DataEfficiencyError

BASE = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    scheduler_config: dict  # min/max difficulty, schedule_type, schedule_config: CurriculumScheduler's input
    difficulty_type: str  # "value" or "percentile"
    clustering_type: str  # "schedule_based" or "single_cluster"
    index_to_sample_path: str | None
    index_to_metric_path: str | None

    @property
    def clusters(self) -> bool:
        return self.clustering_type != "single_cluster"


@dataclass(frozen=True)
class SamplingSpec:
    seed: int
    num_epochs: int
    num_workers: int
    curriculum: bool
    metrics: tuple[MetricSpec, ...]
    data_cluster_path: str | None


def sampling_spec(data_efficiency: Any) -> SamplingSpec:
    """The sampler's settings from the whole `data_efficiency` section (dsconfig object or DeepSpeed dict)."""
    section = config_as_dict(data_efficiency)
    sampling = section.get("data_sampling") or {}
    curriculum = sampling.get("curriculum_learning") or {}
    enabled = bool(curriculum.get("enabled", False))
    metrics = []
    for name, metric in (curriculum.get("curriculum_metrics") or {}).items():
        metric = config_as_dict(metric)
        where = f"{BASE}.{name}"
        difficulty_type = metric.get("difficulty_type", "value")
        clustering_type = metric.get("clustering_type", "schedule_based")
        if difficulty_type not in ("value", "percentile"):
            raise DataEfficiencyError(f"{where}.difficulty_type must be 'value' or 'percentile', got "
                                      f"{difficulty_type!r}")
        if clustering_type not in ("schedule_based", "single_cluster"):
            raise DataEfficiencyError(f"{where}.clustering_type must be 'schedule_based' or 'single_cluster', got "
                                      f"{clustering_type!r}")
        if clustering_type == "schedule_based":
            needed = ["index_to_sample_path"] + (["index_to_metric_path"] if difficulty_type == "value" else [])
            missing = [key for key in needed if not metric.get(key)]
            if missing:
                raise DataEfficiencyError(f"{where}: schedule_based clustering by {difficulty_type} needs "
                                          f"{', '.join(missing)} (the data analyzer's output)")
        if difficulty_type == "percentile":
            _check_percentiles(metric, where)
        scheduler = {key: metric.get(key) for key in ("min_difficulty", "max_difficulty", "schedule_type")}
        scheduler["schedule_config"] = metric.get("schedule_config") or {}
        metrics.append(MetricSpec(name, scheduler, difficulty_type, clustering_type,
                                  metric.get("index_to_sample_path"), metric.get("index_to_metric_path")))
    if enabled and not metrics:
        raise DataEfficiencyError(f"{BASE}: curriculum learning is enabled but names no metric")
    return SamplingSpec(seed=int(section.get("seed", 1234)), num_epochs=int(sampling.get("num_epochs", 1000)),
                        num_workers=int(sampling.get("num_workers", 0)), curriculum=enabled,
                        metrics=tuple(metrics) if enabled else (), data_cluster_path=curriculum.get("data_cluster_path"))


def _check_percentiles(metric: dict, where: str) -> None:
    """Percentile difficulties cut the samples ordered by value into max_difficulty shares, so 0 admits none."""
    for key in ("min_difficulty", "max_difficulty"):
        value = metric.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100):
            raise DataEfficiencyError(f"{where}.{key} = {value!r}: a percentile must be an integer from 0 to 100")
    if metric.get("max_difficulty") == 0:
        raise DataEfficiencyError(f"{where}.max_difficulty = 0: a percentile curriculum must end above 0 percent of "
                                  f"the samples (valid: 1 to 100; 100 is the whole dataset)")
