"""`deepspeed.launcher.runner`: the launcher's entry point (`main`, DeepSpeed's `deepspeed` command: dstrain's
launcher) and the name of the file whose KEY=VALUE lines every node's environment gets."""

from ...launcher.cli import main
from ...launcher.commands import ENV_FILES

DEEPSPEED_ENVIRONMENT_NAME = ENV_FILES[0]  # ".deepspeed_env", read from the working directory and the home folder

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME", "main"]
