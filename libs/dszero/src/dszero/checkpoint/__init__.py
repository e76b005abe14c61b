"""Sharded, reshardable ZeRO checkpoints and their consolidation into one fp32 state dict.

The crash-safe directory swap, the manifest and the writer election are public so the facade's
checkpoints (which hold a ZeRO checkpoint inside) use the same mechanisms.
"""

from .atomic import swap_into_place, write_text_atomically
from .by_parameter import load_parameter_states, read_parameter_states
from .manifest import MANIFEST, verify_manifest, write_manifest
from .sharded import META, RECORD, load, read_meta, recording, save, shard_path
from .writers import is_shared_file_writer
from .zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint

__all__ = ["MANIFEST", "META", "RECORD", "convert_zero_checkpoint_to_fp32_state_dict",
           "get_fp32_state_dict_from_zero_checkpoint", "is_shared_file_writer", "load", "load_parameter_states",
           "read_meta", "read_parameter_states", "recording", "save", "shard_path", "swap_into_place",
           "verify_manifest", "write_manifest", "write_text_atomically"]
