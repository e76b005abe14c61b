"""Checkpoint files: safetensors-compatible, O_DIRECT-friendly, atomic, checksummed."""

from .api import load, load_with_metadata, read_metadata, save
from .format import CheckpointError
from .state import SUPPORTED_TYPES, check_state_dict, load_state_dict, save_state_dict

__all__ = ["SUPPORTED_TYPES", "CheckpointError", "check_state_dict", "load", "load_state_dict", "load_with_metadata",
           "read_metadata", "save", "save_state_dict"]
