"""`deepspeed.runtime.checkpoint_engine`: the object that writes and reads a checkpoint's files, which
`PipelineModule.save_state_dict(dir, checkpoint_engine)` / `load_state_dir` take. dstrain's writes safetensors
files through dsaio and never unpickles (see `torch_checkpoint_engine`)."""

from .checkpoint_engine import CheckpointCommitInfo, CheckpointEngine
from .torch_checkpoint_engine import TorchCheckpointEngine

__all__ = ["CheckpointCommitInfo", "CheckpointEngine", "TorchCheckpointEngine"]
