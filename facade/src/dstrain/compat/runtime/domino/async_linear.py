"""`deepspeed.runtime.domino.async_linear` (dstp.domino)."""

from dstp.domino import DominoAsyncColumnParallelLinear, RowParallelLinearNoComm  # noqa: F401
