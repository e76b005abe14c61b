"""Sharded, reshardable ZeRO checkpoints and their consolidation into one fp32 state dict."""

from .sharded import load, save
from .zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint

__all__ = ["convert_zero_checkpoint_to_fp32_state_dict", "get_fp32_state_dict_from_zero_checkpoint", "load", "save"]
