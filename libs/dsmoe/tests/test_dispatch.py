"""The sparse (index-based) dispatch gives the dense einsum's outputs and gradients; the layer's
residual mixing and its refusals."""

import pytest
import torch
from moe_models import HIDDEN, distinct_experts, mlp

import dsmoe
from dsmoe import MoE, MoEError


def run(dispatch, k, drop, residual=False, dtype=torch.float64, used=None):
    torch.manual_seed(0)
    layer = MoE(HIDDEN, mlp(), num_experts=4, k=k, capacity_factor=0.8, min_capacity=0, drop_tokens=drop,
                use_residual=residual, dispatch=dispatch, generator=torch.Generator().manual_seed(3)).to(dtype)
    distinct_experts(layer)
    x = torch.randn(3, 7, HIDDEN, dtype=dtype, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out, l_aux, counts = layer(x, used)
    (out.pow(2).sum() + l_aux).backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    assert layer.deepspeed_moe.last_dispatch == dispatch
    return out.detach(), l_aux.detach(), counts, x.grad.clone(), grads


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("drop", [True, False], ids=["drop", "no-drop"])
def test_sparse_dispatch_equals_the_dense_einsum(k, drop):
    dense, sparse = run("dense", k, drop), run("sparse", k, drop)
    torch.testing.assert_close(sparse[0], dense[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sparse[1], dense[1])
    assert torch.equal(sparse[2], dense[2])
    torch.testing.assert_close(sparse[3], dense[3], rtol=1e-12, atol=1e-12)
    assert sparse[4].keys() == dense[4].keys()
    for name in dense[4]:
        torch.testing.assert_close(sparse[4][name], dense[4][name], rtol=1e-10, atol=1e-12, msg=name)


def test_used_token_and_residual_through_both_dispatches():
    used = torch.tensor([1.0, 0.0, 1.0] * 7)
    dense, sparse = run("dense", 1, True, residual=True, used=used), run("sparse", 1, True, residual=True, used=used)
    torch.testing.assert_close(sparse[0], dense[0], rtol=1e-12, atol=1e-12)
    for name in dense[4]:
        torch.testing.assert_close(sparse[4][name], dense[4][name], rtol=1e-10, atol=1e-12, msg=name)


def test_auto_dispatch_is_sparse_on_the_cpu_and_over_expert_groups_and_by_size_on_a_gpu():
    assert dsmoe.choose_dispatch("auto", 16, 4, 4) == "sparse"  # measured faster on the CPU at every size
    assert dsmoe.choose_dispatch("auto", 16, 4, 4, ep_size=1, device="cuda") == "dense"
    assert dsmoe.choose_dispatch("auto", 512, 64, 10, ep_size=1, device="cuda") == "sparse"
    assert dsmoe.choose_dispatch("auto", 16, 4, 4, ep_size=2, device="cuda") == "sparse"  # ranks must agree
    assert dsmoe.choose_dispatch("dense", 512, 64, 10) == "dense"


def test_residual_moe_mixes_the_dense_mlp_by_a_per_token_softmax():
    torch.manual_seed(0)
    layer = MoE(HIDDEN, mlp(), num_experts=2, use_residual=True, min_capacity=0).double()
    plain = MoE(HIDDEN, mlp(), num_experts=2, min_capacity=0).double()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if k.startswith("deepspeed_moe.")})
    x = torch.randn(5, HIDDEN, dtype=torch.float64)
    out, _, _ = layer(x)
    experts_out, _, _ = plain(x)
    mix = torch.softmax(layer.coefficient(x), dim=-1)
    expected = experts_out * mix[:, :1] + layer.mlp(x) * mix[:, 1:]
    torch.testing.assert_close(out, expected)
    assert not dsmoe.is_moe_param(layer.mlp[0].weight)  # the dense path is reduced like any dense weight
    assert dsmoe.is_moe_param(layer.deepspeed_moe.experts.deepspeed_experts[0][0].weight)


def test_bad_layouts_are_refused_with_the_numbers():
    with pytest.raises(MoEError, match=r"num_experts 6 is not divisible by ep_size 4.*\[1, 2, 3, 6\]"):
        MoE(HIDDEN, mlp(), num_experts=6, ep_size=4)
    with pytest.raises(MoEError, match="k=3 selects more experts per token than there are \\(2\\)"):
        MoE(HIDDEN, mlp(), num_experts=2, k=3)
    with pytest.raises(MoEError, match="noisy_gate_policy='Gaussian'"):
        MoE(HIDDEN, mlp(), num_experts=2, noisy_gate_policy="Gaussian")
    with pytest.raises(MoEError, match="dispatch='fast'"):
        MoE(HIDDEN, mlp(), num_experts=2, dispatch="fast")
    layer = MoE(HIDDEN, mlp(), num_experts=4, ep_size=2)
    with pytest.raises(MoEError, match="ep_size 2 has no expert-parallel group yet"):
        layer(torch.randn(8, HIDDEN))
    with pytest.raises(MoEError, match="ep_size 4 does not divide the 2 data-parallel rank"):
        dsmoe.check_expert_parallel_size(4, 2, 8)


def test_experts_are_named_by_global_id_once_their_group_is_known():
    layer = MoE(HIDDEN, mlp(), num_experts=4, ep_size=2)
    assert layer.global_expert_ids() == [0, 1]
    layer.deepspeed_moe.experts.deepspeed_experts.renumber(2)  # what set_expert_groups does on ep rank 1
    names = [n for n, _ in layer.named_parameters() if "deepspeed_experts" in n]
    assert names[0] == "deepspeed_moe.experts.deepspeed_experts.2.0.weight"
    assert layer.global_expert_ids() == [2, 3]
    assert layer.deepspeed_moe.experts.deepspeed_experts[1] is list(layer.deepspeed_moe.experts.deepspeed_experts)[1]


def test_jitter_multiplies_the_gate_input_in_training_only():
    torch.manual_seed(0)
    gate = dsmoe.TopKGate(HIDDEN, 4, k=1, min_capacity=0, noisy_gate_policy="Jitter", use_rts=False,
                          generator=torch.Generator().manual_seed(5))
    x = torch.randn(12, HIDDEN)
    noise = 0.99 + torch.rand(12, HIDDEN, generator=torch.Generator().manual_seed(5)) * 0.02
    expected = dsmoe.top1gating(torch.nn.functional.linear(x * noise, gate.wg.weight), 1.0, 0, use_rts=False)
    got = gate(x)
    torch.testing.assert_close(got[1], expected[1])
    gate.eval()
    plain = dsmoe.top1gating(torch.nn.functional.linear(x, gate.wg.weight), 1.0, 0, use_rts=False)
    torch.testing.assert_close(gate(x)[1], plain[1])
