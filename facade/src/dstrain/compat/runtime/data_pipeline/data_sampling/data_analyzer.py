"""`deepspeed.runtime.data_pipeline.data_sampling.data_analyzer`: the offline metric analysis (dsdata's
DataAnalyzer, which also runs over the ranks of a process group: `run_map_reduce`), and DistributedDataAnalyzer
(DeepSpeed's signature: the workers are the ranks of `comm_group`)."""

from dsdata import DataAnalyzer, DistributedDataAnalyzer

__all__ = ["DataAnalyzer", "DistributedDataAnalyzer"]
