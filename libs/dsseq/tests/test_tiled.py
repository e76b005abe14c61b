"""Tiled compute equals the untiled computation in float64 (values and every gradient), with tiles that do
not divide the sequence; each weight's gradient arrives once per backward (gradient hooks fire once), a
weight nobody listed in compute_params included; the peak memory of a tiled MLP is that of a tile."""

import pytest
import torch

from dsseq import (
    SequenceParallelError,
    SequenceTiledCompute,
    TensorMemory,
    TiledFusedLogitsLoss,
    TiledMLP,
    sequence_tiled_compute,
)

TOL = 1e-12


class MLP(torch.nn.Module):
    def __init__(self, hidden=8, inner=12):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False, dtype=torch.float64)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False, dtype=torch.float64)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False, dtype=torch.float64)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def mlp_forward(module, x):
    return module.forward(x)


def grads(*tensors):
    return [t.grad.clone() for t in tensors]


def hook_counts(module):
    counts = {name: 0 for name, _ in module.named_parameters()}
    for name, param in module.named_parameters():
        param.register_post_accumulate_grad_hook(lambda p, name=name: counts.__setitem__(name, counts[name] + 1))
    return counts


@pytest.mark.parametrize(("batch", "seq", "shards"), [(1, 10, 3), (3, 7, 4), (2, 5, 9)])
def test_tiled_mlp_equals_the_mlp(batch, seq, shards):
    torch.manual_seed(0)
    mlp = MLP()
    x = torch.randn(batch, seq, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(batch, seq, 8, dtype=torch.float64)
    (mlp(x) * weight).sum().backward()
    expected = grads(x, *mlp.parameters())
    x.grad = None
    mlp.zero_grad(set_to_none=True)
    counts = hook_counts(mlp)
    out = TiledMLP.apply(mlp_forward, mlp, x, shards, None)
    assert (out - mlp(x)).abs().max() < TOL
    (out * weight).sum().backward()
    for got, want in zip(grads(x, *mlp.parameters()), expected):
        assert (got - want).abs().max() < TOL
    assert set(counts.values()) == {1}  # one gradient per weight, not one per tile


def test_a_weight_nobody_listed_gets_its_gradient():
    mlp = MLP()
    extra = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8, dtype=torch.float64))
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    TiledMLP.apply(lambda m, t: m(t) * extra, mlp, x, 2, list(mlp.parameters())).sum().backward()
    got = extra.grad.clone()
    extra.grad = None
    (mlp(x) * extra).sum().backward()
    assert (got - extra.grad).abs().max() < TOL


def test_a_tiled_mlp_holds_one_tiles_activations():
    torch.manual_seed(3)
    mlp = MLP(hidden=8, inner=256)
    x = torch.randn(1, 256, 8, dtype=torch.float64, requires_grad=True)
    peaks = []
    for tiled in (False, True):
        with TensorMemory() as memory:
            out = TiledMLP.apply(mlp_forward, mlp, x, 16, None) if tiled else mlp(x)
            out.sum().backward()
        peaks.append(memory.peak_bytes)
    inner_activation = 256 * 256 * 8  # one [seq, inner] float64 tensor
    assert peaks[0] > 3 * inner_activation  # untiled: gate, up, their product and more at once
    assert peaks[1] < inner_activation  # tiled: a sixteenth of each, plus the [seq, hidden] input/output


def test_tiled_fused_logits_loss_equals_the_loss():
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 11, bias=False, dtype=torch.float64)
    x = torch.randn(2, 9, 8, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (2, 9))
    y[0, :3] = -100

    def loss_fn(module, x_tile, y_tile):
        return torch.nn.functional.cross_entropy(module(x_tile), y_tile, reduction="sum", ignore_index=-100)

    whole = loss_fn(head, x.reshape(-1, 8), y.reshape(-1)) * 3.0
    whole.backward()
    expected = grads(x, head.weight)
    x.grad = None
    head.weight.grad = None
    counts = hook_counts(head)
    tiled = TiledFusedLogitsLoss.apply(loss_fn, head, x, y, None, 4, [head.weight], "sum")
    (tiled * 3.0).backward()
    assert abs(tiled.item() * 3.0 - whole.item()) < TOL
    for got, want in zip(grads(x, head.weight), expected):
        assert (got - want).abs().max() < TOL
    assert counts == {"weight": 1}
    # "mean": the mean of the tiles' losses, whatever torch.chunk's rounding makes of 6 tiles of 18 rows
    mean = TiledFusedLogitsLoss.apply(loss_fn, head, x, y, None, 5, None, "mean")
    tiles = [loss_fn(head, xt, yt) for xt, yt in zip(x.reshape(-1, 8).chunk(5), y.reshape(-1).chunk(5))]
    assert abs(mean.item() - torch.stack(tiles).mean().item()) < TOL


def test_sequence_tiled_compute_equals_the_function():
    torch.manual_seed(2)
    head = torch.nn.Linear(8, 5, bias=False, dtype=torch.float64)
    hidden = torch.randn(2, 10, 8, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(2, 10, 1, dtype=torch.float64)

    def fn(hidden_states, scale, module):
        return module(hidden_states) * scale

    weight = torch.randn(2, 10, 5, dtype=torch.float64)
    (fn(hidden, scale, head) * weight).mean().backward()
    expected = grads(hidden, head.weight)
    hidden.grad = None
    head.weight.grad = None
    out = sequence_tiled_compute(fn, 10, 3, {"hidden_states": hidden, "scale": scale}, {"module": head},
                                 "hidden_states", output_reduction=None)
    (out * weight).mean().backward()
    for got, want in zip(grads(hidden, head.weight), expected):
        assert (got - want).abs().max() < TOL
    # DeepSpeed's positional form, a scalar per tile (unshard dimension 0) summed
    hidden.grad = None
    head.weight.grad = None

    def tile_loss(hidden_states, module):
        return module(hidden_states).square().sum()

    total = SequenceTiledCompute.apply(tile_loss, 10, 4, ["hidden_states"], ["module"], "hidden_states", None, 0,
                                       "sum", hidden, head)
    total.backward()
    hidden2 = hidden.detach().clone().requires_grad_()
    head2 = torch.nn.Linear(8, 5, bias=False, dtype=torch.float64)
    head2.weight.data.copy_(head.weight.data)
    tile_loss(hidden2, head2).backward()
    assert abs(total.item() - tile_loss(hidden2, head2).item()) < 1e-9
    assert (hidden.grad - hidden2.grad).abs().max() < TOL and (head.weight.grad - head2.weight.grad).abs().max() < TOL


@pytest.mark.parametrize(("call", "message"), [
    (lambda: TiledMLP.apply(mlp_forward, MLP(), torch.ones(4), 2, None), r"TiledMLP: x must be \[batch, seq, hidden\]"),
    (lambda: TiledMLP.apply(mlp_forward, MLP(), torch.ones(1, 4, 8), 0, None), "shards must be a positive integer"),
    (lambda: TiledFusedLogitsLoss.apply(None, None, torch.ones(2, 3, 4), torch.ones(2, 4), None, 2, [], "avg"),
     "output_reduction 'avg'"),
    (lambda: TiledFusedLogitsLoss.apply(None, None, torch.ones(2, 3, 4), torch.ones(2, 4), None, 2, [], "sum"),
     r"x \(2, 3, 4\) and y \(2, 4\) differ"),
    (lambda: sequence_tiled_compute(None, 5, 2, {"h": torch.ones(1, 4, 2)}, {}, "h"), r"is not \[batch, seqlen=5"),
    (lambda: sequence_tiled_compute(None, 4, 2, {"h": torch.ones(1, 4, 2)}, {}, "x"),
     "grad_requiring_tensor_key 'x' is not among kwargs_to_shard"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(SequenceParallelError, match=message):
        call()
