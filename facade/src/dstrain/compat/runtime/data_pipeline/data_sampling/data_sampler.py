"""`deepspeed.runtime.data_pipeline.data_sampling.data_sampler` (dsdata's curriculum sampler)."""

from dsdata import DeepSpeedDataSampler

__all__ = ["DeepSpeedDataSampler"]
