"""`deepspeed.checkpoint.constants`: the names of DeepSpeed's checkpoint files and keys."""

from ...checkpoint.deepspeed.constants import *  # noqa: F403
