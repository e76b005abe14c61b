"""`DistributedDataAnalyzer`: DeepSpeed's analyzer whose workers are the ranks of a process group.

Each rank of `comm_group` (or of the default group, with `num_workers` / `worker_id` given as for DataAnalyzer)
maps its contiguous part of the dataset; the ranks meet at barriers and worker 0 merges the parts into the same
files DataAnalyzer writes (`<metric>_sample_to_metric`, `_index_to_sample`, ...), which DeepSpeed's sampler reads.
DeepSpeed's signature takes no metric dtypes: each metric's values are integers (as DeepSpeed requires), stored
as int64 (a function returning floats is refused by name), unless `metric_dtypes` gives each metric's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .data_analyzer import DataAnalyzer
from .errors import DataEfficiencyError


def _integer_metric(function: Callable, name: str, dtype: Any) -> Callable:
    """`function` with its integer results cast to `dtype` (floats refused: the sampler indexes by value)."""

    def integer_values(data: Any) -> Any:
        values = function(data)
        if torch.is_tensor(values):
            values = values.detach().cpu().numpy()
        if not isinstance(values, np.ndarray):
            raise DataEfficiencyError(f"metric {name!r}: the metric function must return a tensor or numpy array, "
                                      f"got {type(values).__name__}")
        if not np.issubdtype(values.dtype, np.integer):
            raise DataEfficiencyError(f"metric {name!r}: DistributedDataAnalyzer stores integer metric values (as "
                                      f"DeepSpeed's); the function returned {values.dtype}")
        return values.astype(dtype, copy=False)

    return integer_values


class DistributedDataAnalyzer(DataAnalyzer):
    """DeepSpeed's DistributedDataAnalyzer signature over dsdata's analyzer (the mutable defaults are only read).
    `device` is accepted for DeepSpeed's signature: the collectives here carry only a run id and barriers."""

    def __init__(self, dataset, num_workers: int = 1, num_threads: int = 1, worker_id: int = 0, batch_size: int = 1,
                 metric_names: Sequence[str] = [], metric_functions: Sequence[Callable] = [],
                 metric_types: Sequence[str] = [], save_path: str = "./", collate_fn: Callable | None = None,
                 device: str = "cuda", comm_group: Any = None, sample_indices: Sequence[int] | None = None, *,
                 metric_dtypes: Sequence[Any] | None = None):
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            import dscomm

            dscomm.init_distributed()  # as DeepSpeed's does: the launcher's environment names the group
        if comm_group is not None:  # the group's ranks are the workers (num_workers / worker_id are ignored)
            num_workers, worker_id = dist.get_world_size(comm_group), dist.get_rank(comm_group)
        if len(metric_names) != len(metric_functions):
            raise DataEfficiencyError(f"DistributedDataAnalyzer: {len(metric_names)} metric_names but "
                                      f"{len(metric_functions)} metric_functions; give one function per metric")
        if metric_dtypes is not None:  # the caller's dtypes, checked by DataAnalyzer as there
            dtypes, functions = list(metric_dtypes), list(metric_functions)
        else:
            dtypes = [np.int64] * len(metric_names)
            functions = [_integer_metric(f, n, np.int64) for f, n in zip(metric_functions, metric_names)]
        super().__init__(dataset, num_workers=num_workers, worker_id=worker_id, num_threads=num_threads,
                         batch_size=batch_size, metric_names=metric_names, metric_functions=functions,
                         metric_types=metric_types, metric_dtypes=dtypes, save_path=save_path, collate_fn=collate_fn,
                         sample_indices=sample_indices)
        self.comm_group = comm_group
        self.device = device

    def run_map_reduce(self, comm_group: Any = None) -> None:
        """Map on every rank, merge on worker 0; collective over the analyzer's group."""
        super().run_map_reduce(comm_group if comm_group is not None else self.comm_group)


__all__ = ["DistributedDataAnalyzer"]
