"""DeepSpeed's transformer kernel (deepspeed.ops.transformer): DeepSpeedTransformerConfig and
DeepSpeedTransformerLayer, a BERT encoder layer with DeepSpeed's parameter layout, on the fused kernels of
dstrain.ops.kernels (Triton on a GPU with the `kernels` extra, plain torch everywhere else)."""

from .config import DeepSpeedTransformerConfig, TransformerConfig
from .layer import DeepSpeedTransformerLayer, transformer_layer
from .memory import count_saved_activations
from .sparse import SPARSE_ATTENTION_NOTE, refuse_sparse_attention

__all__ = ["SPARSE_ATTENTION_NOTE", "DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "TransformerConfig",
           "count_saved_activations", "refuse_sparse_attention", "transformer_layer"]
