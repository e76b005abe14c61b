"""`DataAnalyzer`: DeepSpeed's offline map-reduce that computes a difficulty metric for every sample and
indexes the samples by it, for curriculum learning.

Map: the dataset is cut into `num_workers` contiguous parts (one per process or node, `worker_id`),
each into `num_threads` parts run as processes; each part computes the metrics batch by batch and
writes its results under `save_path/<metric>/worker<w>_thread<t>/`. Reduce (worker 0, after every map
finished) merges them into the files DeepSpeed's sampler reads, in its memory-mapped indexed format:

- `<metric>_sample_to_metric`: the metric of each sample, in dataset order;
- `<metric>_index_to_metric`: the distinct values, ascending;
- `<metric>_index_to_sample`: for each distinct value, its samples in dataset order;
- `<metric>_index_to_sample_percentile_merged`: the same samples with every ~1% of the values merged;
- `<metric>_metric_value` (accumulate_value_over_samples): the metric summed over all samples.

The merged files depend only on the samples' order, never on how the map was split, so their bytes are
the same for any number of workers and threads (DeepSpeed's document index varies with the reduce's
thread count; here it is always [0, items]).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, Subset

from . import analyzer_parts, analyzer_reduce
from ._processes import end_with_parent
from .errors import DataEfficiencyError
from .indexed_dataset import as_numpy_dtype, close_mmap_dataset_builder, create_mmap_dataset_builder
from .logs import logger

SINGLE_VALUE = "single_value_per_sample"
ACCUMULATE = "accumulate_value_over_samples"
METRIC_TYPES = (SINGLE_VALUE, ACCUMULATE)
PROGRESS_INTERVAL_S = 10.0  # at most one progress line per thread this often (and one at its end)


def split_index(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous ranges covering start..end, as even as integers allow (DeepSpeed's split)."""
    bounds = np.linspace(start, end, num=parts + 1, dtype=int)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(parts)]


def thread_directory(save_path: str, metric: str, worker: int, thread: int) -> str:
    return os.path.join(save_path, metric, f"worker{worker}_thread{thread}")


class DataAnalyzer:
    """DeepSpeed's DataAnalyzer, with its signature (the mutable defaults are read, never changed)."""

    def __init__(self, dataset, num_workers: int = 1, worker_id: int = 0, num_threads: int = 1,
                 num_threads_reduce: int = 1, specific_threads: Sequence[int] = [], batch_size: int = 1,
                 metric_names: Sequence[str] = [], metric_functions: Sequence[Callable] = [],
                 metric_types: Sequence[str] = [], metric_dtypes: Sequence[Any] = [],
                 save_path: str = "./", collate_fn: Callable | None = None, custom_map_init: Callable | None = None,
                 custom_map_update: Callable | None = None, custom_map_finalize: Callable | None = None,
                 custom_reduce: Callable | None = None, sample_indices: Sequence[int] | None = None, *,
                 run_id: str | None = None):
        for name, value in (("num_workers", num_workers), ("num_threads", num_threads),
                            ("num_threads_reduce", num_threads_reduce), ("batch_size", batch_size)):
            if not isinstance(value, int) or value < 1:
                raise DataEfficiencyError(f"DataAnalyzer({name}={value!r}): must be a positive integer")
        if not 0 <= worker_id < num_workers:
            raise DataEfficiencyError(f"DataAnalyzer(worker_id={worker_id}): must be in 0..{num_workers - 1}")
        bad_threads = [t for t in specific_threads if not 0 <= t < num_threads]
        if bad_threads:
            raise DataEfficiencyError(f"DataAnalyzer(specific_threads={list(specific_threads)}): {bad_threads} are "
                                      f"outside 0..{num_threads - 1}")
        lengths = {len(metric_names), len(metric_types)}
        if custom_map_update is None:
            lengths |= {len(metric_functions), len(metric_dtypes)}
        if len(lengths) != 1:
            raise DataEfficiencyError(f"DataAnalyzer: metric_names, metric_functions, metric_types and metric_dtypes "
                                      f"need one entry per metric; got {len(metric_names)}, {len(metric_functions)}, "
                                      f"{len(metric_types)} and {len(metric_dtypes)}")
        for name, kind in zip(metric_names, metric_types):
            if kind not in METRIC_TYPES:
                raise DataEfficiencyError(f"DataAnalyzer: metric {name!r} has metric_type {kind!r}; valid: "
                                          f"{', '.join(METRIC_TYPES)}")
            if not name or os.sep in name or name in (".", ".."):
                raise DataEfficiencyError(f"DataAnalyzer: metric name {name!r} must be a plain file name")
        if sample_indices is not None and len(sample_indices) != len(dataset):
            raise DataEfficiencyError(f"DataAnalyzer(sample_indices=...): {len(sample_indices)} indices for a dataset "
                                      f"of {len(dataset)} samples")
        self.dataset = dataset
        self.num_workers = num_workers
        self.worker_id = worker_id
        self.num_threads = num_threads
        self.num_threads_reduce = num_threads_reduce
        self.specific_threads = list(specific_threads)
        self.batch_size = batch_size
        self.metric_names = list(metric_names)
        self.metric_functions = list(metric_functions)
        self.metric_types = list(metric_types)
        self.metric_dtypes = [as_numpy_dtype(d) for d in metric_dtypes] if custom_map_update is None \
            else list(metric_dtypes)
        self.save_path = os.fspath(save_path)
        self.collate_fn = collate_fn
        self.custom_map_init = custom_map_init
        self.custom_map_update = custom_map_update
        self.custom_map_finalize = custom_map_finalize
        self.custom_reduce = custom_reduce
        self.sample_indices = sample_indices
        self.run_id = analyzer_parts.checked_run_id(run_id) if run_id is not None else None
        self.map_run_id: str | None = None  # the run id this analyzer's run_map wrote its parts under
        self.run_scope = "analysis"  # or "worker": an id this worker made alone (see analyzer_parts)
        self._agreed_run_id: str | None = None  # run_map_reduce's, for the run_map it calls

    # ------------------------------------------------------------------ map
    def run_map(self) -> None:
        """Compute the metrics of this worker's part of the dataset, one process per thread."""
        worker_start, worker_end = split_index(0, len(self.dataset), self.num_workers)[self.worker_id]
        self.thread_splits = split_index(worker_start, worker_end, self.num_threads)
        threads = self.specific_threads or list(range(self.num_threads))
        self._choose_run(threads)
        if self.num_threads == 1:
            self.run_map_helper(0)
            return
        # This process runs the last thread itself: one fork fewer (a fork copies the page tables of a process
        # that may hold the whole dataset) and no core left idle waiting.
        children = {thread: self._fork_thread(thread) for thread in threads[:-1]}
        failed = []
        threads_before = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            self.run_map_helper(threads[-1])
        except Exception as exc:
            failed.append(f"thread {threads[-1]} ({type(exc).__name__}: {exc})")
        finally:
            torch.set_num_threads(threads_before)
        for thread, pid in children.items():
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                failed.append(f"thread {thread} (exit code {os.waitstatus_to_exitcode(status)})")
        if failed:
            raise DataEfficiencyError(f"DataAnalyzer worker {self.worker_id}: map failed in {', '.join(failed)}; "
                                      f"its error is printed above")

    def _choose_run(self, threads: list[int]) -> None:
        """The run this map's parts record: the given (or agreed) one; with specific_threads (rerunning some
        threads of a worker) the run the worker's other parts belong to; else a new one."""
        if self.run_id is not None or self._agreed_run_id is not None:
            self.map_run_id, self.run_scope = self.run_id or self._agreed_run_id, "analysis"
            return
        others = [thread_directory(self.save_path, name, self.worker_id, t) for name in self.metric_names
                  for t in range(self.num_threads) if t not in threads]
        found = {analyzer_parts.run_of(part) for part in others}
        if others and len(found) == 1 and None not in found:
            self.map_run_id, self.run_scope = found.pop()
            return
        self.map_run_id = analyzer_parts.new_run_id()
        self.run_scope = "analysis" if self.num_workers == 1 else "worker"

    def _fork_thread(self, thread: int) -> int:
        # A plain fork (not multiprocessing): the children inherit the dataset and the metric functions, and
        # the analyzer also runs inside daemonic processes (a distributed launcher's ranks).
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                end_with_parent(parent)
                self._run_thread(thread)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        return pid

    def _run_thread(self, thread: int) -> None:
        torch.set_num_threads(1)  # one core per map process
        self.run_map_helper(thread)

    def run_map_helper(self, thread_id: int) -> None:
        start, end = self.thread_splits[thread_id]
        if self.map_run_id is None:  # called on its own, as DeepSpeed's scripts may
            self._choose_run([thread_id])
        run_id = self.map_run_id
        directories = [thread_directory(self.save_path, name, self.worker_id, thread_id) for name in self.metric_names]
        for directory in directories:
            analyzer_parts.forget(directory)
        subset = Subset(self.dataset, range(start, end))
        batches = BatchSampler(SequentialSampler(subset), batch_size=self.batch_size, drop_last=False)
        loader = DataLoader(subset, batch_sampler=batches, num_workers=0, collate_fn=self.collate_fn)
        init = self.custom_map_init or self.init_metric_results
        results = init(thread_id, self.metric_names, self.metric_types, self.metric_dtypes, self.save_path,
                       self.worker_id)
        update = self.custom_map_update or self.update_metric_results
        progress = _Progress(f"worker {self.worker_id} thread {thread_id}", end - start)
        done = 0
        for data in loader:
            update(data, self.metric_types, self.metric_dtypes, self.metric_functions, results, start + done)
            done += _batch_length(data)
            progress.update(done)
        finalize = self.custom_map_finalize or self.finalize_metric_results
        finalize(self.metric_types, self.metric_dtypes, results)
        for directory, expected in zip(directories, self._part_fields(self.worker_id, thread_id)):
            analyzer_parts.record(directory, run_id=run_id, run_scope=self.run_scope, **expected)
        progress.finish(done)

    def _part_fields(self, worker: int, thread: int) -> list[dict]:
        """What the part of (worker, thread) records for each metric: where it sits and what it computed."""
        worker_start, worker_end = split_index(0, len(self.dataset), self.num_workers)[worker]
        start, end = split_index(worker_start, worker_end, self.num_threads)[thread]
        return [{"metric": name, "metric_type": kind, "worker": worker, "thread": thread, "start": start, "end": end,
                 "num_workers": self.num_workers, "num_threads": self.num_threads, "dataset_size": len(self.dataset)}
                for name, kind in zip(self.metric_names, self.metric_types)]

    def init_metric_results(self, thread_id: int, metric_names, metric_types, metric_dtypes, save_path,
                            worker_id) -> list[dict]:
        results = []
        for name, kind in zip(metric_names, metric_types):
            directory = thread_directory(save_path, name, worker_id, thread_id)
            os.makedirs(directory, exist_ok=True)
            results.append({"directory": directory, "name": name, "kind": kind, "values": [], "samples": [],
                            "sum": None})
        return results

    def update_metric_results(self, data, metric_types, metric_dtypes, metric_functions, metric_results,
                              batch_start_idx: int = 0) -> None:
        count = _batch_length(data)
        for kind, dtype, function, result in zip(metric_types, metric_dtypes, metric_functions, metric_results):
            values = _metric_values(function(data), dtype, result["name"])
            if kind == SINGLE_VALUE:
                if values.size != count:
                    raise DataEfficiencyError(f"metric {result['name']!r}: single_value_per_sample needs one value "
                                              f"per sample; the function returned {values.size} for a batch of {count}")
                result["values"].append(values.reshape(-1))
                result["samples"].append(self._sample_ids(data, batch_start_idx, count))
            else:
                total = values.astype(np.int64)
                result["sum"] = total if result["sum"] is None else result["sum"] + total

    def _sample_ids(self, data, batch_start: int, count: int) -> np.ndarray:
        if isinstance(data, dict) and "index" in data:  # Megatron's datasets carry each sample's index
            return np.asarray(torch.as_tensor(data["index"]).reshape(count, -1)[:, 0], dtype=np.int64)
        positions = np.arange(batch_start, batch_start + count, dtype=np.int64)
        if self.sample_indices is not None:
            return np.asarray(self.sample_indices, dtype=np.int64)[positions]
        return positions

    def finalize_metric_results(self, metric_types, metric_dtypes, metric_results) -> None:
        for kind, dtype, result in zip(metric_types, metric_dtypes, metric_results):
            prefix = os.path.join(result["directory"], result["name"])
            if kind == SINGLE_VALUE:
                values = np.concatenate(result["values"]) if result["values"] else np.zeros(0, dtype)
                samples = np.concatenate(result["samples"]) if result["samples"] else np.zeros(0, np.int64)
                _write_scalars(f"{prefix}_sample_to_metric", values, dtype)
                _write_scalars(f"{prefix}_sample_index", samples, np.int64)
            elif result["sum"] is not None:
                builder = create_mmap_dataset_builder(f"{prefix}_metric_value", np.int64)
                builder.add_item(result["sum"].reshape(-1))
                close_mmap_dataset_builder(builder, f"{prefix}_metric_value")

    # ------------------------------------------------------------------ reduce
    def run_reduce(self) -> None:
        """Merge every worker's and thread's map results into the indexed files the sampler reads."""
        if self.custom_reduce is not None:
            self.custom_reduce(self.dataset, self.metric_names, self.metric_types, self.save_path, self.num_workers,
                               self.num_threads, self.num_threads_reduce)
            return
        layout = [(w, t) for w in range(self.num_workers) for t in range(self.num_threads)]
        fields = {where: self._part_fields(*where) for where in layout}
        for index, (name, kind) in enumerate(zip(self.metric_names, self.metric_types)):
            parts = [thread_directory(self.save_path, name, w, t) for w, t in layout]
            run = analyzer_parts.check_parts(name, parts, [fields[where][index] for where in layout],
                                             self.map_run_id or self.run_id)
            logger.info(f"metric {name}: merging {len(parts)} map part(s) of run {run}")
            if kind == SINGLE_VALUE:
                analyzer_reduce.reduce_single_value(name, os.path.join(self.save_path, name), parts, len(self.dataset))
            else:
                analyzer_reduce.reduce_accumulated(name, os.path.join(self.save_path, name), parts)

    def run_map_reduce(self, comm_group: Any = None) -> None:
        """run_map on every worker, then worker 0 reduces; collective over `comm_group` when distributed."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        # Every worker's parts under one run id: the given one, or one worker 0 makes for this run (agreed on
        # every rank alike, so that a run_id given to some ranks only cannot leave the others in a collective).
        self._agreed_run_id = _agreed_run_id(comm_group) if distributed else None
        try:
            self.run_map()
        finally:
            self._agreed_run_id = None
        if distributed:
            torch.distributed.barrier(group=comm_group)  # every worker's map files are written
        elif self.num_workers > 1:
            raise DataEfficiencyError("run_map_reduce with num_workers > 1 needs torch.distributed initialized (one "
                                      "process per worker); or run run_map on each worker and run_reduce once")
        if self.worker_id == 0:
            self.run_reduce()
        if distributed:
            torch.distributed.barrier(group=comm_group)  # the merged files exist before anyone reads them


def _agreed_run_id(group: Any) -> str:
    """A fresh run id made by the group's first rank, as raw bytes in a tensor (nothing is unpickled)."""
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(dist.get_backend(group)) else "cpu"
    chosen = torch.tensor(list(bytes.fromhex(analyzer_parts.new_run_id())), dtype=torch.uint8, device=device)
    source = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(chosen, source, group=group)
    return bytes(chosen.cpu().tolist()).hex()


def _batch_length(data: Any) -> int:
    if isinstance(data, dict):
        data = next(iter(data.values()))
    if isinstance(data, (list, tuple)):
        data = data[0] if data and (torch.is_tensor(data[0]) or isinstance(data[0], np.ndarray)) else data
    return len(data)


def _metric_values(values: Any, dtype: Any, name: str) -> np.ndarray:
    if not (torch.is_tensor(values) or isinstance(values, np.ndarray)):
        raise DataEfficiencyError(f"metric {name!r}: the metric function must return a tensor or numpy array, got "
                                  f"{type(values).__name__}")
    array = values.detach().cpu().numpy() if torch.is_tensor(values) else values
    if array.dtype != as_numpy_dtype(dtype):
        raise DataEfficiencyError(f"metric {name!r}: the metric function returned {array.dtype} but metric_dtypes "
                                  f"says {as_numpy_dtype(dtype)}")
    return array


def _write_scalars(prefix: str, values: np.ndarray, dtype: Any) -> None:
    builder = create_mmap_dataset_builder(prefix, dtype)
    builder.add_scalars(values)
    close_mmap_dataset_builder(builder, prefix)


class _Progress:
    """One line every PROGRESS_INTERVAL_S seconds: samples done, rate and the time left at that rate."""

    def __init__(self, what: str, total: int):
        self.what, self.total = what, total
        self.start = self.last = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL_S:
            self.last = now
            rate = done / max(now - self.start, 1e-9)
            left = (self.total - done) / rate if rate > 0 else float("inf")
            logger.info(f"{self.what}: {done} of {self.total} samples, {rate:,.0f} samples/s, about "
                        f"{_duration(left)} left")

    def finish(self, done: int) -> None:
        elapsed = time.monotonic() - self.start
        logger.info(f"{self.what}: {done} samples in {_duration(elapsed)}")


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "an unknown time"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
