"""Activation checkpointing, as `deepspeed.checkpointing`: dscomm's, under the name DeepSpeed's users import.

The implementation (and its model-parallel RNG tracker) lives in `dscomm.checkpointing`, below the
parallel libraries that use it; this module is the same functions and the same state.
"""

from dscomm.checkpointing import *  # noqa: F403
from dscomm.checkpointing import __all__  # noqa: F401
