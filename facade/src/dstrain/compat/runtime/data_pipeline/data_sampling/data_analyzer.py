"""`deepspeed.runtime.data_pipeline.data_sampling.data_analyzer`: the offline metric analysis (dsdata's DataAnalyzer,
which also runs over the ranks of a process group: `run_map_reduce`)."""

from dsdata import DataAnalyzer

__all__ = ["DataAnalyzer"]
