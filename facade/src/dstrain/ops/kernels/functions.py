"""Autograd functions over the fused ops. Each keeps exactly the tensors its backward needs, through
save_for_backward (so saved-tensor hooks see them all), and never a dropout mask: a mask is redrawn from
its seed. The dispatch (`ops_for`) picks Triton or torch per call."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import ops_for


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _sum_rows(x: torch.Tensor) -> torch.Tensor:
    return _rows(x).sum(0)


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):
        ctx.save_for_backward(x, bias)
        return ops_for(x).bias_gelu_forward(x, bias)

    @staticmethod
    def backward(ctx, grad):
        x, bias = ctx.saved_tensors
        grad_x = ops_for(x).bias_gelu_backward(grad, x, bias)
        return grad_x, _sum_rows(grad_x).to(bias.dtype)


class _BiasGeluLinear(torch.autograd.Function):
    """linear(gelu(x + bias), weight) keeping only x: the GeLU output is recomputed in backward
    (DeepSpeed's gelu_checkpoint)."""

    @staticmethod
    def forward(ctx, x, bias, weight):
        ctx.save_for_backward(x, bias, weight)
        return F.linear(ops_for(x).bias_gelu_forward(x, bias), weight)

    @staticmethod
    def backward(ctx, grad):
        x, bias, weight = ctx.saved_tensors
        ops = ops_for(x)
        activation = ops.bias_gelu_forward(x, bias)
        grad_weight = _rows(grad).t() @ _rows(activation)
        grad_x = ops.bias_gelu_backward(grad @ weight, x, bias)
        return grad_x, _sum_rows(grad_x).to(bias.dtype), grad_weight


class _BiasDropoutResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, residual, p, seed):
        ctx.p, ctx.seed, ctx.bias_dtype = p, seed, bias.dtype
        return ops_for(x).bias_dropout_residual_forward(x, bias, residual, p, seed)

    @staticmethod
    def backward(ctx, grad):
        grad_x = ops_for(grad).dropout(grad, ctx.p, ctx.seed)
        return grad_x, _sum_rows(grad_x).to(ctx.bias_dtype), grad, None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, from_output):
        y, mean, rstd = ops_for(x).layer_norm_forward(_rows(x), weight, bias, eps)
        y = y.view(x.shape)
        ctx.from_output = from_output
        if from_output:  # normalize_invertible: the input is not kept, its gradients come from y
            ctx.save_for_backward(y, weight, bias, rstd)
        else:
            ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        if ctx.from_output:
            y, weight, bias, rstd = ctx.saved_tensors
            x, mean = None, None
        else:
            x, weight, bias, mean, rstd = ctx.saved_tensors
            y = None
        source = x if x is not None else y
        grad_x, grad_weight, grad_bias = ops_for(source).layer_norm_backward(
            _rows(grad), _rows(x) if x is not None else None, _rows(y) if y is not None else None,
            weight, bias, mean, rstd)
        return grad_x.view(source.shape), grad_weight, grad_bias, None, None


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias), tanh approximation, bias broadcast over the last dimension."""
    return _BiasGelu.apply(x, bias)


def bias_gelu_linear(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """linear(gelu(x + bias), weight) that stores x only and recomputes the GeLU in backward."""
    return _BiasGeluLinear.apply(x, bias, weight)


def bias_dropout_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, p: float,
                          seed: int) -> torch.Tensor:
    """residual + dropout(x + bias); stores nothing (the mask is redrawn from `seed`)."""
    return _BiasDropoutResidual.apply(x, bias, residual, p, seed)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               invertible: bool = False) -> torch.Tensor:
    """LayerNorm over the last dimension. invertible=True keeps the output instead of the input and
    computes the gradients from it (DeepSpeed's normalize_invertible; needs no zero in weight)."""
    return _LayerNorm.apply(x, weight, bias, eps, invertible)


class _Attention(torch.autograd.Function):
    """dropout(softmax(q k^T * scale + mask)) v, keeping q, k, v and the softmax output; the dropped
    probabilities are kept too unless recompute_dropout (DeepSpeed's attn_dropout_checkpoint)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, p, seed, recompute_dropout):
        probs, dropped = ops_for(q).softmax_dropout_forward(q @ k.transpose(-1, -2), mask, scale, p, seed)
        ctx.scale, ctx.p, ctx.seed = scale, p, seed
        ctx.kept_dropped = p > 0 and not recompute_dropout
        ctx.save_for_backward(q, k, v, probs, *((dropped,) if ctx.kept_dropped else ()))
        return dropped @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, probs, *kept = ctx.saved_tensors
        ops = ops_for(q)
        dropped = kept[0] if kept else ops.dropout(probs, ctx.p, ctx.seed)
        grad_v = dropped.transpose(-1, -2) @ grad
        del dropped
        grad_scores = ops.softmax_dropout_backward(grad @ v.transpose(-1, -2), probs, ctx.scale, ctx.p, ctx.seed)
        return grad_scores @ k, grad_scores.transpose(-1, -2) @ q, grad_v, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
              p: float, seed: int, recompute_dropout: bool = False) -> torch.Tensor:
    """Scaled masked softmax attention with dropout on the probabilities.

    q, k, v: [batch, heads, seq, head_dim]; mask: None or the additive BERT mask as [batch, seq] (keys).
    """
    return _Attention.apply(q, k, v, mask, scale, p, seed, recompute_dropout)
