"""`dstrain.comm`: DeepSpeed's `deepspeed.comm`, which is dscomm."""

from dscomm import *  # noqa: F403
from dscomm import __all__  # noqa: F401
