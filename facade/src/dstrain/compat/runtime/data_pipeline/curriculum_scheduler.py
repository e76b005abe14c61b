"""`deepspeed.runtime.data_pipeline.curriculum_scheduler` (dsdata's)."""

from dsdata import CurriculumScheduler

__all__ = ["CurriculumScheduler"]
