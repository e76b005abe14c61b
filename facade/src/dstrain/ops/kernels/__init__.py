"""Fused kernels of the transformer layer (bias+GeLU, bias+dropout+residual, LayerNorm forward and
backward, scaled masked softmax+dropout) as autograd functions, on Triton where a GPU and triton are
present and on plain torch everywhere else, with the same numbers. Dropout masks are redrawn from seeds,
never stored. triton is the optional extra `dstrain[kernels]`."""

from .backend import ENV, backend_name, triton_available, triton_interpreted
from .functions import attention, bias_dropout_residual, bias_gelu, bias_gelu_linear, layer_norm

__all__ = ["ENV", "attention", "backend_name", "bias_dropout_residual", "bias_gelu", "bias_gelu_linear",
           "layer_norm", "triton_available", "triton_interpreted"]
