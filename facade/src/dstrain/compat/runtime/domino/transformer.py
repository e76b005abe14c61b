"""`deepspeed.runtime.domino.transformer` (dstp.domino)."""

from dstp.domino import *  # noqa: F403
from dstp.domino import DominoTransformer, DominoTransformerLayer, ShardedAttention  # noqa: F401
