"""Which samples a curriculum cluster holds: the samples whose difficulty lies between two schedule
values, read from the data analyzer's index files (pure numpy on memory-mapped arrays).

A cluster is defined by the difficulties before and after a schedule change, so it can be rebuilt
from the index files at any time: a checkpoint stores the definition, not the members.
"""

from __future__ import annotations

import numpy as np

from .errors import DataEfficiencyError
from .indexed_dataset import MMapIndexedDataset
from .sampling_config import MetricSpec

NO_LOWER_BOUND = None  # "previous difficulty" of the first cluster of a value metric: below every value


class MetricIndex:
    """One metric's index_to_sample (+ index_to_metric for value difficulties), checked against the dataset."""

    def __init__(self, spec: MetricSpec, dataset_size: int):
        self.spec = spec
        self.by_value = MMapIndexedDataset(spec.index_to_sample_path, skip_warmup=True)
        self.samples = self.by_value.flat()
        if self.samples.size:
            # A negative index would silently wrap to the end of the dataset (numpy and Python indexing).
            low, high = int(self.samples.min()), int(self.samples.max())
            if low < 0 or high >= dataset_size:
                raise DataEfficiencyError(f"{spec.index_to_sample_path}: sample index {low if low < 0 else high} is "
                                          f"outside the dataset of {dataset_size} samples (valid: 0 to "
                                          f"{dataset_size - 1}; was it analyzed on another dataset?)")
        self.row_starts = np.concatenate([[0], np.cumsum(np.asarray(self.by_value.sizes, dtype=np.int64))])
        self.values = None
        if spec.difficulty_type == "value":
            metric = MMapIndexedDataset(spec.index_to_metric_path, skip_warmup=True)
            if len(metric) != len(self.by_value):
                raise DataEfficiencyError(f"{spec.index_to_metric_path} has {len(metric)} values but "
                                          f"{spec.index_to_sample_path} has {len(self.by_value)} rows; they are one "
                                          f"analysis's pair of files")
            self.values = np.asarray(metric.flat(), dtype=np.int64)

    def up_to(self, previous, current) -> np.ndarray:
        """The samples with difficulty in (previous, current]: metric values, or percentiles of the samples
        ordered by value (previous None: from the start)."""
        if self.values is not None:
            low = -np.inf if previous is None else previous
            rows = np.nonzero((self.values > low) & (self.values <= current))[0]
            if rows.size == 0:
                return self.samples[:0]
            if rows[-1] - rows[0] + 1 == rows.size:  # the usual case: values ascending, one contiguous run
                return self.samples[self.row_starts[rows[0]]:self.row_starts[rows[-1] + 1]]
            return np.concatenate([self.samples[self.row_starts[r]:self.row_starts[r + 1]] for r in rows])
        total = self.samples.size
        max_percentile = self.spec.scheduler_config["max_difficulty"]
        per_percentile = total // max_percentile
        start = per_percentile * (previous or 0)
        end = total if current >= max_percentile else per_percentile * current
        return self.samples[start:end]


def cluster_members(indexes: dict[str, MetricIndex], metrics: tuple[MetricSpec, ...], dataset_size: int,
                    previous: dict, current: dict, existing: list[np.ndarray]) -> np.ndarray | None:
    """The members of the cluster a schedule change from `previous` to `current` opens, as DeepSpeed
    builds them: with several clustering metrics, the samples within every metric's current difficulty
    not already in a cluster; with one, the samples between its previous and current difficulty; with
    none, every sample once. None when the change opens no cluster."""
    clustering = [m for m in metrics if m.clusters]
    if len(clustering) > 1:
        members = None
        for metric in metrics:
            if metric.clusters:
                within = np.asarray(indexes[metric.name].up_to(None, current[metric.name]), dtype=np.int64)
            else:
                within = np.arange(dataset_size, dtype=np.int64)
            members = within if members is None else np.intersect1d(members, within, assume_unique=True)
        for cluster in existing:
            members = np.setdiff1d(members, cluster, assume_unique=True)
        return members
    members = np.arange(dataset_size, dtype=np.int64) if not existing else None
    for metric in clustering:
        members = np.array(indexes[metric.name].up_to(previous[metric.name], current[metric.name]), dtype=np.int64)
    return members
