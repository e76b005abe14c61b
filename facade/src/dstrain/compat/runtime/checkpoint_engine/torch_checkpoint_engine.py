"""`deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine`: DeepSpeed's default checkpoint engine. DeepSpeed's
pickles with torch.save; dstrain's writes the same nested state (tensors, numbers, strings, lists, dicts) as a
safetensors file through dsaio, atomically and durably, and reads it back without unpickling anything, so its
files end in `.safetensors`."""

from __future__ import annotations

from typing import Any

import dsaio

from ....errors import CheckpointLoadError
from .checkpoint_engine import CheckpointEngine


class TorchCheckpointEngine(CheckpointEngine):
    """One state dict per safetensors file (dsaio.save_state_dict / load_state_dict)."""

    suffix = ".safetensors"

    def save(self, state_dict: Any, path: Any) -> None:
        dsaio.save_state_dict(state_dict, path)

    def load(self, path: Any, map_location: Any = None) -> Any:
        """The state saved at `path`, its tensors on `map_location` (a device or its name; default: the CPU)."""
        device = "cpu" if map_location is None or callable(map_location) else str(map_location)
        try:
            return dsaio.load_state_dict(path, device)
        except dsaio.CheckpointError as exc:
            raise CheckpointLoadError(f"{path}: {exc}") from None


__all__ = ["TorchCheckpointEngine"]
