"""The layer's dropout and memory flags on the torch path: masks are redrawn from seeds (a fixed seed gives
identical runs, gradients agree with the forward's masks, the drop rate is the ratio), and each of
normalize_invertible, attn_dropout_checkpoint and gelu_checkpoint leaves every gradient as it was while
the bytes saved for backward (counted with saved-tensor hooks) fall by what it drops."""

import pytest
import torch

from dstrain.ops.kernels import torch_ops
from dstrain.ops.transformer import (
    DeepSpeedTransformerConfig,
    DeepSpeedTransformerLayer,
    count_saved_activations,
    transformer_layer,
)

BATCH, SEQ, HIDDEN, HEADS, INTER = 2, 16, 32, 4, 128
FLAGS = ("normalize_invertible", "attn_dropout_checkpoint", "gelu_checkpoint")


def make_layer(pre_layer_norm=True, dtype=torch.float64, **overrides) -> DeepSpeedTransformerLayer:
    torch.manual_seed(3)
    args = dict(hidden_size=HIDDEN, intermediate_size=INTER, heads=HEADS, attn_dropout_ratio=0.1,
                hidden_dropout_ratio=0.1, num_hidden_layers=2, initializer_range=0.3, pre_layer_norm=pre_layer_norm,
                seed=42)
    layer = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(**{**args, **overrides})).to(dtype)
    with torch.no_grad():  # norms and biases away from their 1 / 0 init, so every gradient path carries signal
        for name, param in layer.named_parameters():
            if name.endswith(("b", "nw")) or name == "norm_w":
                param.add_(0.1 * torch.randn_like(param))
    return layer


def run(layer, flags: dict, seed: int = 1234, x: torch.Tensor | None = None):
    """One forward and backward through the layer's function with explicit flags and dropout seed; returns
    the output, every gradient, and the activation bytes saved."""
    if x is None:
        x = torch.randn(BATCH, SEQ, HIDDEN, dtype=layer.attn_qkvw.dtype, generator=torch.Generator().manual_seed(5))
    x = x.clone().requires_grad_()
    mask = torch.zeros(BATCH, SEQ, dtype=x.dtype)
    mask[1, 11:] = -10000.0
    layer.zero_grad(set_to_none=True)
    config = layer.config
    with count_saved_activations(layer.parameters()) as saved:
        out = transformer_layer(x, mask, layer, heads=config.heads, pre_layer_norm=config.pre_layer_norm,
                                eps=config.layer_norm_eps, attn_p=config.attn_dropout_ratio,
                                hidden_p=config.hidden_dropout_ratio, seed=seed, **flags)
    out.backward(torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view(out.shape))
    return out.detach(), [x.grad] + [p.grad for p in layer.parameters()], saved.bytes


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre_ln", "post_ln"])
def test_each_memory_flag_keeps_gradients_and_saves_what_it_drops(pre_layer_norm):
    layer = make_layer(pre_layer_norm)
    item = 8  # float64
    out, grads, baseline = run(layer, {})
    tokens = BATCH * SEQ
    # What each flag stops keeping, in bytes: the LayerNorm inputs (two in pre-LN: the layer input and the
    # attention residual; in post-LN the second LayerNorm keeps its output, the layer's output, instead of
    # its input, so one); the dropped attention probabilities; the GeLU output.
    expected_saving = {"normalize_invertible": (2 if pre_layer_norm else 1) * tokens * HIDDEN * item,
                       "attn_dropout_checkpoint": BATCH * HEADS * SEQ * SEQ * item,
                       "gelu_checkpoint": tokens * INTER * item}
    # each LayerNorm keeps mean and rstd ([tokens], the input's dtype here); the invertible one rstd only
    expected_saving["normalize_invertible"] += 2 * tokens * item
    for flag in FLAGS:
        flag_out, flag_grads, saved = run(layer, {flag: True})
        if flag == "normalize_invertible":  # x_hat from (y - b) / w: equal up to rounding, not bit for bit
            torch.testing.assert_close(flag_out, out, rtol=0, atol=0)
            for got, want in zip(flag_grads, grads):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        else:  # the same values recomputed: bit for bit
            assert torch.equal(flag_out, out)
            assert all(torch.equal(got, want) for got, want in zip(flag_grads, grads)), flag
        assert baseline - saved == expected_saving[flag], (flag, baseline, saved)
    _, all_grads, all_saved = run(layer, dict.fromkeys(FLAGS, True))
    for got, want in zip(all_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert baseline - all_saved == sum(expected_saving.values())


def test_dropout_masks_in_backward_are_the_forwards():
    """gradcheck through the whole layer with dropout on and one seed: backward redraws the very masks the
    forward used (a different mask would make the analytic gradient disagree with the numerical one)."""
    layer = make_layer(True, attn_dropout_ratio=0.3, hidden_dropout_ratio=0.3, hidden_size=8, heads=2,
                       intermediate_size=16)
    mask = torch.zeros(1, 5, dtype=torch.float64)
    config = layer.config

    def layer_fn(x, flags):
        return transformer_layer(x, mask, layer, heads=2, pre_layer_norm=True, eps=config.layer_norm_eps,
                                 attn_p=0.3, hidden_p=0.3, seed=99, **flags)

    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    for flags in ({}, dict.fromkeys(FLAGS, True)):
        assert torch.autograd.gradcheck(lambda t, f=flags: layer_fn(t, f), (x,))


def test_a_fixed_seed_gives_identical_runs_and_other_seeds_differ():
    def train_run(seed):
        DeepSpeedTransformerLayer.layer_id = 0  # a fresh process, as DeepSpeed counts layers
        layers = torch.nn.ModuleList([make_layer(True, torch.float32, seed=seed) for _ in range(2)])
        x = torch.randn(BATCH, SEQ, HIDDEN, generator=torch.Generator().manual_seed(0), requires_grad=True)
        outputs = []
        for _ in range(2):  # two steps: the second draws new masks
            h = x
            for layer in layers:
                h = layer(h)
            h.square().sum().backward()
            outputs.append(h.detach())
        return outputs, [p.grad.clone() for p in layers.parameters()]

    first, again, other = train_run(42), train_run(42), train_run(43)
    assert all(torch.equal(a, b) for a, b in zip(first[0] + first[1], again[0] + again[1]))
    assert not torch.equal(first[0][0], first[0][1])  # each call draws new masks
    assert not torch.equal(first[0][0], other[0][0])


def test_seed_minus_one_follows_torch_manual_seed():
    layer = make_layer(True, torch.float32, seed=-1)
    x = torch.randn(BATCH, SEQ, HIDDEN)
    torch.manual_seed(7)
    first = layer(x)
    torch.manual_seed(7)
    assert torch.equal(layer(x), first)
    assert not torch.equal(layer(x), first)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drop_rates_are_the_ratio_within_one_percent(p):
    numel = 1 << 21
    ones = torch.ones(numel)
    kept = torch_ops.bias_dropout_residual_forward(ones, torch.zeros(1), torch.zeros(numel), p, 11)
    assert abs((kept == 0).double().mean().item() - p) < 0.01 * p
    assert torch.all((kept == 0) | torch.isclose(kept, torch.tensor(1 / (1 - p))))
    probs, dropped = torch_ops.softmax_dropout_forward(torch.zeros(8, 4, 256, 256), None, 1.0, p, 12)
    assert abs((dropped == 0).double().mean().item() - p) < 0.01 * p
    grad = torch_ops.softmax_dropout_backward(torch.ones_like(dropped), probs, 1.0, p, 12)
    # the redrawn mask matches: grad of dropped elements only flows through the softmax's shared term
    assert torch.equal(torch_ops.dropout(probs, p, 12) == 0, dropped == 0)
    assert grad.shape == probs.shape


def test_memory_flags_on_the_layer_module_reduce_its_saved_bytes():
    """Through DeepSpeedTransformerLayer itself (the config's flags), float32."""
    def saved_bytes(**flags):
        layer = make_layer(True, torch.float32, **flags)
        with count_saved_activations(layer.parameters()) as saved:
            layer(torch.randn(BATCH, SEQ, HIDDEN)).sum().backward()
        return saved.bytes

    baseline = saved_bytes()
    assert saved_bytes(gelu_checkpoint=True) == baseline - BATCH * SEQ * INTER * 4
    assert saved_bytes(attn_dropout_checkpoint=True) == baseline - BATCH * HEADS * SEQ * SEQ * 4
    assert saved_bytes(normalize_invertible=True) < baseline
