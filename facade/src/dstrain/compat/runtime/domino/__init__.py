"""`deepspeed.runtime.domino`: DeepSpeed's Domino layers for scripts that build them by hand (dstp.domino)."""

from ....wiring.optional_libs import require

try:  # dstp is an optional library: name its install, not a stack
    from dstp.domino import (
        AttnMaskType,
        AttnType,
        CoreAttention,
        DominoAsyncColumnParallelLinear,
        DominoModule,
        DominoTransformer,
        DominoTransformerLayer,
        DominoUtil,
        LayerType,
        ModelType,
        NoOper,
        RowParallelLinearNoComm,
        ShardedAttention,
        bias_dropout_add,
    )
except ModuleNotFoundError:
    require("dstp", "dstrain.runtime.domino")
    raise

__all__ = ["AttnMaskType", "AttnType", "CoreAttention", "DominoAsyncColumnParallelLinear", "DominoModule",
           "DominoTransformer", "DominoTransformerLayer", "DominoUtil", "LayerType", "ModelType", "NoOper",
           "RowParallelLinearNoComm", "ShardedAttention", "bias_dropout_add"]
