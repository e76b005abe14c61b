"""The analyzer's reduce: every map part's results, in dataset order, merged into the final indexed files
with whole-array numpy operations (a stable sort by value instead of DeepSpeed's per-value CSV files)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .errors import DataEfficiencyError
from .indexed_dataset import (
    MMapIndexedDataset,
    close_mmap_dataset_builder,
    create_mmap_dataset_builder,
    find_fit_int_dtype,
)
from .logs import logger

PERCENTILE_GROUPS = 100  # the percentile-merged index joins every len(values) // 100 distinct values


def _read_part(prefix: str, what: str) -> np.ndarray:
    if not MMapIndexedDataset.exists(prefix):
        raise DataEfficiencyError(f"{prefix}.idx/.bin missing: the map part that writes the {what} did not finish "
                                  f"(run run_map on every worker and thread before run_reduce)")
    data = MMapIndexedDataset(prefix, skip_warmup=True)
    return np.array(data.flat())


def reduce_single_value(metric: str, metric_dir: str, parts: Sequence[str], total_samples: int) -> None:
    values = np.concatenate([_read_part(os.path.join(p, f"{metric}_sample_to_metric"), "metric values")
                             for p in parts]).astype(np.int64)
    samples = np.concatenate([_read_part(os.path.join(p, f"{metric}_sample_index"), "sample indices")
                              for p in parts]).astype(np.int64)
    if values.size != total_samples or samples.size != total_samples:
        raise DataEfficiencyError(f"metric {metric!r}: the map parts hold {values.size} samples but the dataset has "
                                  f"{total_samples}; a map part is stale or missing (rerun run_map everywhere)")
    if total_samples == 0:
        raise DataEfficiencyError(f"metric {metric!r}: the dataset is empty; nothing to index")
    value_dtype = find_fit_int_dtype(int(values.min()), int(values.max()))
    sample_dtype = find_fit_int_dtype(0, max(total_samples - 1, int(samples.max()), 0))
    logger.info(f"metric {metric}: {total_samples} samples, values {values.min()}..{values.max()} stored as "
                f"{value_dtype}, sample indices as {sample_dtype}")
    prefix = os.path.join(metric_dir, metric)

    builder = create_mmap_dataset_builder(f"{prefix}_sample_to_metric", value_dtype)
    builder.add_scalars(values)
    close_mmap_dataset_builder(builder, f"{prefix}_sample_to_metric")

    order = np.argsort(values, kind="stable")  # each value's samples stay in dataset order
    distinct, counts = np.unique(values[order], return_counts=True)
    by_value = samples[order]
    builder = create_mmap_dataset_builder(f"{prefix}_index_to_sample", sample_dtype)
    builder.add_concatenated(by_value, counts)
    close_mmap_dataset_builder(builder, f"{prefix}_index_to_sample")
    builder = create_mmap_dataset_builder(f"{prefix}_index_to_metric", value_dtype)
    builder.add_scalars(distinct)
    close_mmap_dataset_builder(builder, f"{prefix}_index_to_metric")

    merge_step = max(1, distinct.size // PERCENTILE_GROUPS)
    group_sizes = np.add.reduceat(counts, np.arange(0, distinct.size, merge_step))
    builder = create_mmap_dataset_builder(f"{prefix}_index_to_sample_percentile_merged", sample_dtype)
    builder.add_concatenated(by_value, group_sizes)
    close_mmap_dataset_builder(builder, f"{prefix}_index_to_sample_percentile_merged")
    _log_percentiles(metric, distinct, counts, total_samples)


def _log_percentiles(metric: str, distinct: np.ndarray, counts: np.ndarray, total: int) -> None:
    cumulative = np.cumsum(counts)
    marks = []
    for percentile in range(5, 101, 5):
        position = int(np.searchsorted(cumulative, total * percentile / 100.0))
        marks.append(f"{percentile}%: {distinct[min(position, distinct.size - 1)]}")
    logger.info(f"metric {metric} percentiles: {', '.join(marks)}")


def reduce_accumulated(metric: str, metric_dir: str, parts: Sequence[str]) -> None:
    total = None
    for part in parts:
        prefix = os.path.join(part, f"{metric}_metric_value")
        if not MMapIndexedDataset.exists(prefix):
            continue  # a part with no samples accumulates nothing
        values = np.array(MMapIndexedDataset(prefix, skip_warmup=True)[0], dtype=np.int64)
        if total is not None and values.shape != total.shape:
            raise DataEfficiencyError(f"metric {metric!r}: {prefix} holds {values.size} values, another part "
                                      f"{total.size}; an accumulated metric has the same shape in every part")
        total = values if total is None else total + values
    if total is None:
        raise DataEfficiencyError(f"metric {metric!r}: no map part wrote an accumulated value under {metric_dir}")
    dtype = find_fit_int_dtype(int(total.min()), int(total.max()))
    prefix = os.path.join(metric_dir, f"{metric}_metric_value")
    builder = create_mmap_dataset_builder(prefix, dtype)
    builder.add_item(total)
    close_mmap_dataset_builder(builder, prefix)
