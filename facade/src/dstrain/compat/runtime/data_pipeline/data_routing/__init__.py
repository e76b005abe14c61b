"""`deepspeed.runtime.data_pipeline.data_routing`: random layerwise token dropping (dsdata's random-LTD)."""
