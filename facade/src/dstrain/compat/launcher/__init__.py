"""`deepspeed.launcher`: the paths of DeepSpeed's launcher package that tools import (Accelerate's
`accelerate launch --use_deepspeed` reads `runner.DEEPSPEED_ENVIRONMENT_NAME`). dstrain's launcher itself is
`dstrain.launcher` (the `dstrain` command, or `deepspeed` with dstrain-deepspeed-compat)."""

from .runner import DEEPSPEED_ENVIRONMENT_NAME, main

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME", "main"]
