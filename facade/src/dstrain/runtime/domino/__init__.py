"""`deepspeed.runtime.domino`: DeepSpeed's Domino layers for scripts that build them by hand (dstp.domino)."""

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

__all__ = ["AttnMaskType", "AttnType", "CoreAttention", "DominoAsyncColumnParallelLinear", "DominoModule",
           "DominoTransformer", "DominoTransformerLayer", "DominoUtil", "LayerType", "ModelType", "NoOper",
           "RowParallelLinearNoComm", "ShardedAttention", "bias_dropout_add"]
