"""Random layerwise token dropping (random-LTD)."""

from .convert import (
    configure_random_ltd,
    convert_to_random_ltd,
    random_ltd_layers,
    remove_random_ltd_state_dict,
    save_without_random_ltd,
)
from .layer import RandomLayerTokenDrop
from .ops import gather_encoder_mask, gather_tokens, sample_token_indices, scatter_tokens, slice_decoder_mask
from .scheduler import RandomLTDScheduler, effective_seq_length

__all__ = ["RandomLTDScheduler", "RandomLayerTokenDrop", "configure_random_ltd", "convert_to_random_ltd",
           "effective_seq_length", "gather_encoder_mask", "gather_tokens", "random_ltd_layers",
           "remove_random_ltd_state_dict", "sample_token_indices", "save_without_random_ltd", "scatter_tokens",
           "slice_decoder_mask"]
