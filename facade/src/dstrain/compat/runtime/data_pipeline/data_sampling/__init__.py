"""`deepspeed.runtime.data_pipeline.data_sampling`: curriculum data sampling and its offline analysis (dsdata's)."""
