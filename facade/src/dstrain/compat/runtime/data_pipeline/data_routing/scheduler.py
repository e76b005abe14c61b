"""`deepspeed.runtime.data_pipeline.data_routing.scheduler`: random-LTD's kept-token schedule (dsdata's)."""

from dsdata import RandomLTDScheduler

__all__ = ["RandomLTDScheduler"]
