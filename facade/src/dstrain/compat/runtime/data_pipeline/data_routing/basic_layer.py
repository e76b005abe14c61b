"""`deepspeed.runtime.data_pipeline.data_routing.basic_layer`: the token-dropping layer wrapper (dsdata's)."""

from dsdata import RandomLayerTokenDrop

__all__ = ["RandomLayerTokenDrop"]
