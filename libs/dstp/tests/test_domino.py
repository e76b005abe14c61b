"""DeepSpeed's Domino names: a DominoTransformerLayer cut over 2 gloo ranks (two half-batches, asynchronous
row all-reduces forward, input-gradient all-reduces waited for where needed backward) computes what the
same layer on one rank does: outputs, input gradients and every weight gradient, in float64."""

from types import SimpleNamespace

import torch

import dscomm
from dscomm.testing import run_ranks
from dstp import domino


def domino_config():
    return SimpleNamespace(hidden_size=16, num_attention_heads=4, kv_channels=4, ffn_hidden_size=32, num_layers=1,
                           add_bias_linear=True, params_dtype=torch.float64, perform_initialization=True,
                           init_method=lambda w: torch.nn.init.normal_(w, std=0.2),
                           output_layer_init_method=lambda w: torch.nn.init.normal_(w, std=0.2),
                           attention_dropout=0.0, hidden_dropout=0.0, layernorm_epsilon=1e-5,
                           apply_residual_connection_post_layernorm=False)


# name -> the dimension its rows or columns are cut along (None: replicated)
CUTS = {"self_attention.query_key_value.weight": 0, "self_attention.query_key_value.bias": 0,
        "self_attention.dense.weight": 1, "linear_fc1.weight": 0, "linear_fc1.bias": 0, "linear_fc2.weight": 1}


def run(layer, hidden):
    halves = [h.clone().requires_grad_(True) for h in torch.chunk(hidden, 2, dim=1)]
    out0, out1 = layer(halves, None)
    weights = torch.linspace(-1, 1, hidden.numel(), dtype=hidden.dtype).view_as(hidden)
    (torch.cat([out0, out1], dim=1) * weights).sum().backward()
    return torch.cat([out0, out1], dim=1).detach(), torch.cat([h.grad for h in halves], dim=1)


def domino_rank(rank, world):
    alone = dscomm.ParallelDims(world).build()  # tensor groups of one rank: the reference layer
    cut = dscomm.ParallelDims(world, tensor=world).build()
    torch.manual_seed(0)
    whole = domino.DominoTransformerLayer(domino_config(), alone, None, 1)
    layer = domino.DominoTransformerLayer(domino_config(), cut, None, 1)
    whole_params = dict(whole.named_parameters())
    with torch.no_grad():
        for name, param in layer.named_parameters():
            source = whole_params[name]
            param.copy_(source.chunk(world, dim=CUTS[name])[rank] if name in CUTS else source)
    hidden = torch.randn(6, 4, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_out, ref_grad = run(whole, hidden)
    out, grad = run(layer, hidden)
    worst = max((out - ref_out).abs().max().item(), (grad - ref_grad).abs().max().item())
    for name, param in layer.named_parameters():
        expected = whole_params[name].grad
        if name in CUTS:
            expected = expected.chunk(world, dim=CUTS[name])[rank]
        worst = max(worst, (param.grad - expected).abs().max().item())
    return worst


def test_a_domino_layer_over_two_ranks_equals_one_rank():
    for worst in run_ranks(domino_rank, 2, timeout=120):
        assert worst < 1e-10
