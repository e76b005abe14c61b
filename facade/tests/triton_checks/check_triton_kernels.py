"""The Triton kernels against the torch path, run by test_transformer_triton.py in a process of its own:
on a CUDA device where there is one, else in Triton's CPU interpreter (TRITON_INTERPRET=1 must be set before
triton is imported, which is why this file runs apart from the rest of the suite)."""

import os

import pytest
import torch

from dstrain.ops.kernels import torch_ops, triton_ops
from dstrain.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# float32: the same formulas in another order of reduction; half types: one unit in the last place
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
             torch.float16: {"rtol": 2e-3, "atol": 1e-3}}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=generator)).to(device=DEVICE, dtype=dtype)


def close(got, want, dtype):
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_forward_and_backward(dtype):
    x, bias, grad = randn(6, 40, dtype=dtype, scale=3), randn(40, dtype=dtype, seed=1), randn(6, 40, dtype=dtype, seed=2)
    close(triton_ops.bias_gelu_forward(x, bias), torch_ops.bias_gelu_forward(x, bias), dtype)
    close(triton_ops.bias_gelu_backward(grad, x, bias), torch_ops.bias_gelu_backward(grad, x, bias), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_dropout_residual_without_dropout(dtype):
    x, bias, residual = randn(5, 24, dtype=dtype), randn(24, dtype=dtype, seed=1), randn(5, 24, dtype=dtype, seed=2)
    close(triton_ops.bias_dropout_residual_forward(x, bias, residual, 0.0, 1),
          torch_ops.bias_dropout_residual_forward(x, bias, residual, 0.0, 1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [40, 64])
def test_layer_norm_forward_and_both_backwards(dtype, width):
    x, grad = randn(7, width, dtype=dtype, scale=2), randn(7, width, dtype=dtype, seed=1)
    weight, bias = (1 + 0.2 * randn(width, seed=2)).to(dtype), randn(width, dtype=dtype, seed=3)
    want, got = torch_ops.layer_norm_forward(x, weight, bias, 1e-5), triton_ops.layer_norm_forward(x, weight, bias, 1e-5)
    for g, w in zip(got, want):
        close(g, w, dtype)
    y, mean, rstd = want
    for from_input in (True, False):  # from x, and from y (normalize_invertible)
        args = (x, None) if from_input else (None, y)
        for g, w in zip(triton_ops.layer_norm_backward(grad, *args, weight, bias, mean, rstd),
                        torch_ops.layer_norm_backward(grad, *args, weight, bias, mean, rstd)):
            close(g, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_mask", [True, False])
def test_scaled_masked_softmax_forward_and_backward(dtype, with_mask):
    scores, grad = randn(2, 3, 5, 7, dtype=dtype, scale=3), randn(2, 3, 5, 7, dtype=dtype, seed=1)
    mask = torch.zeros(2, 7, device=DEVICE, dtype=dtype) if with_mask else None
    if with_mask:
        mask[1, 4:] = -10000.0
    got, want = triton_ops.softmax_dropout_forward(scores, mask, 0.3, 0.0, 1), \
        torch_ops.softmax_dropout_forward(scores, mask, 0.3, 0.0, 1)
    close(got[0], want[0], dtype)
    assert got[1] is got[0]  # no dropout: the probabilities themselves
    close(triton_ops.softmax_dropout_backward(grad, want[0], 0.3, 0.0, 1),
          torch_ops.softmax_dropout_backward(grad, want[0], 0.3, 0.0, 1), dtype)


def test_dropout_rate_is_the_ratio_within_one_percent():
    p = 0.1
    dropped = triton_ops.dropout(torch.ones(1 << 22, device=DEVICE), p, 21)
    assert abs((dropped == 0).double().mean().item() - p) < 0.01 * p
    kept = dropped[dropped != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))


def test_every_kernel_draws_the_same_mask_from_the_same_seed():
    """Forward and backward of each op redraw one mask per (seed, element): softmax's forward, the
    recomputation of the dropped probabilities (attn_dropout_checkpoint), and softmax's backward."""
    p, seed = 0.25, 5
    scores = randn(2, 2, 16, 64)
    probs, dropped = triton_ops.softmax_dropout_forward(scores, None, 1.0, p, seed)
    assert abs((dropped == 0).double().mean().item() - p) < 0.05
    assert torch.equal(triton_ops.dropout(probs, p, seed), dropped)
    # backward with grad = 1 on kept elements only: for each row the softmax gradient is then
    # probs * (keep / (1 - p) - sum(probs * keep) / (1 - p)), which needs the forward's mask
    keep = (dropped != 0).float()
    expected = probs * (keep / (1 - p) - (probs * keep).sum(-1, keepdim=True) / (1 - p))
    torch.testing.assert_close(triton_ops.softmax_dropout_backward(torch.ones_like(probs), probs, 1.0, p, seed),
                               expected, rtol=1e-5, atol=1e-6)
    x, bias = randn(4, 256), torch.zeros(256, device=DEVICE)
    out = triton_ops.bias_dropout_residual_forward(x, bias, torch.zeros_like(x), p, seed)
    assert torch.equal(triton_ops.dropout(x, p, seed), out)  # the residual kernel's backward uses dropout()


def layer_outputs(backend, pre_layer_norm, flags, monkeypatch, dropout=0.0):
    monkeypatch.setenv("DSTRAIN_KERNELS", backend)
    DeepSpeedTransformerLayer.layer_id = 0
    torch.manual_seed(0)
    layer = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(
        hidden_size=32, heads=4, intermediate_size=64, attn_dropout_ratio=dropout, hidden_dropout_ratio=dropout,
        initializer_range=0.2, num_hidden_layers=1, pre_layer_norm=pre_layer_norm, seed=3, **flags)).to(DEVICE)
    x = randn(2, 9, 32, seed=4).requires_grad_()
    mask = torch.zeros(2, 1, 1, 9, device=DEVICE)
    mask[0, ..., 6:] = -10000.0
    out = layer(x, mask)
    out.backward(randn(2, 9, 32, seed=5))
    return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre_ln", "post_ln"])
@pytest.mark.parametrize("flags", [{}, {"normalize_invertible": True, "attn_dropout_checkpoint": True,
                                        "gelu_checkpoint": True}], ids=["plain", "all_flags"])
def test_the_layer_on_triton_equals_the_layer_on_torch(pre_layer_norm, flags, monkeypatch):
    if DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1"
    on_torch = layer_outputs("torch", pre_layer_norm, flags, monkeypatch)
    on_triton = layer_outputs("triton", pre_layer_norm, flags, monkeypatch)
    for got, want in zip(on_triton, on_torch):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_layer_on_triton_with_dropout_repeats_under_one_seed(monkeypatch):
    flags = {"attn_dropout_checkpoint": True}
    first = layer_outputs("triton", True, flags, monkeypatch, dropout=0.2)
    again = layer_outputs("triton", True, flags, monkeypatch, dropout=0.2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    plain = layer_outputs("triton", True, {}, monkeypatch, dropout=0.2)  # dropped probabilities kept: same numbers
    for got, want in zip(plain, first):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
