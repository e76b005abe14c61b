"""The fused ops of the transformer layer in plain torch: the path that runs everywhere.

Every function here has a twin of the same name and signature in `triton_ops`; the two compute the same
numbers (float32 reductions for half inputs, DeepSpeed's tanh GeLU) so either can serve the autograd
functions in `functions`. Dropout masks are never kept: they are drawn again from the seed they were made
from, element for element, in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_HALF = (torch.float16, torch.bfloat16)


def keep_mask(shape: torch.Size, p: float, seed: int, device: torch.device) -> torch.Tensor:
    """The elements dropout keeps: a pure function of (shape, p, seed, device), so backward redraws it."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(shape, generator=generator, device=device) >= p


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in _HALF else x


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """x with the dropped elements zeroed and the kept ones scaled by 1 / (1 - p); x itself when p == 0."""
    if p == 0:
        return x
    keep = keep_mask(x.shape, p, seed, x.device)
    return torch.where(keep, _upcast(x) / (1 - p), 0.0).to(x.dtype)


def bias_gelu_forward(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias) with the tanh approximation (DeepSpeed's kernel computes that one)."""
    return F.gelu(_upcast(x) + _upcast(bias), approximate="tanh").to(x.dtype)


def bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The gradient of bias_gelu_forward at x (the bias's gradient is its sum over rows)."""
    pre = _upcast(x) + _upcast(bias)
    return torch.ops.aten.gelu_backward(_upcast(grad), pre, approximate="tanh").to(x.dtype)


def bias_dropout_residual_forward(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, p: float,
                                  seed: int) -> torch.Tensor:
    """residual + dropout(x + bias)."""
    summed = _upcast(x) + _upcast(bias)
    if p > 0:
        summed = torch.where(keep_mask(x.shape, p, seed, x.device), summed / (1 - p), 0.0)
    return (summed + _upcast(residual)).to(x.dtype)


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dimension of a 2-d x: (y, mean, rstd), the statistics in float32 for half x."""
    width = x.shape[-1]
    if x.dtype in _HALF:
        y, mean, rstd = torch.native_layer_norm(x.float(), [width], weight.float(), bias.float(), eps)
        return y.to(x.dtype), mean.view(-1), rstd.view(-1)
    y, mean, rstd = torch.native_layer_norm(x, [width], weight, bias, eps)
    return y, mean.view(-1), rstd.view(-1)


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor | None,
                        weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor | None,
                        rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (x, weight, bias) of LayerNorm, from its input x, or from its output y when x is None.

    The output suffices because x_hat = (y - bias) / weight (the invertible LayerNorm of DeepSpeed's
    normalize_invertible); that needs no zero in weight, as DeepSpeed's kernel does.
    """
    g = _upcast(grad)
    w = _upcast(weight)
    if x is not None:
        x_hat = (_upcast(x) - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    else:
        x_hat = (_upcast(y) - _upcast(bias)) / w
    grad_weight = (g * x_hat).sum(0)
    grad_bias = g.sum(0)
    scaled = g * w
    width = x_hat.shape[-1]
    c1 = (scaled * x_hat).sum(-1, keepdim=True) / width
    c2 = scaled.sum(-1, keepdim=True) / width
    grad_x = (scaled - (x_hat * c1 + c2)) * rstd.unsqueeze(-1)
    dtype = (x if x is not None else y).dtype
    return grad_x.to(dtype), grad_weight.to(weight.dtype), grad_bias.to(bias.dtype)


def softmax_dropout_forward(scores: torch.Tensor, mask: torch.Tensor | None, scale: float, p: float,
                            seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, dropped): softmax(scores * scale + mask) over the last dimension, and its dropout.

    scores is [batch, heads, query, key]; mask, when given, is the additive BERT mask as [batch, key].
    dropped is probs itself when p == 0.
    """
    logits = _upcast(scores) * scale
    if mask is not None:
        logits = logits + _upcast(mask)[:, None, None, :]
    probs = torch.softmax(logits, dim=-1)
    dropped = torch.where(keep_mask(probs.shape, p, seed, probs.device), probs / (1 - p), 0.0) if p > 0 else probs
    return probs.to(scores.dtype), dropped.to(scores.dtype)


def softmax_dropout_backward(grad_dropped: torch.Tensor, probs: torch.Tensor, scale: float, p: float,
                             seed: int) -> torch.Tensor:
    """The gradient of the scores from the gradient of the dropped probabilities (the mask redrawn)."""
    grad_probs = dropout(_upcast(grad_dropped), p, seed)
    probs32 = _upcast(probs)
    inner = (grad_probs * probs32).sum(-1, keepdim=True)
    return (scale * probs32 * (grad_probs - inner)).to(probs.dtype)
