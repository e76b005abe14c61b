"""PR-MoE pyramids and Mixture-of-Students distillation."""

import pytest
import torch
from moe_models import HIDDEN, mlp
from torch.nn import functional as F

import dsmoe
from dsmoe import DenseMLP, MixtureOfStudents, MoE, MoEError, distillation_loss, pyramid_layers


def test_a_pyramid_has_one_layer_per_expert_count():
    layers = pyramid_layers(HIDDEN, mlp, [1, 2, 4, 8], ep_size=2, mlp_type="residual", min_capacity=0)
    assert isinstance(layers[0], DenseMLP)
    assert [layer.num_experts for layer in layers[1:]] == [2, 4, 8]
    assert [layer.ep_size for layer in layers[1:]] == [2, 2, 2]
    assert all(layer.use_residual for layer in layers[1:])
    assert [len(layer.deepspeed_moe.experts.deepspeed_experts) for layer in layers[1:]] == [1, 2, 4]
    x = torch.randn(6, HIDDEN)
    out, l_aux, counts = layers[0](x)
    assert out.shape == x.shape and l_aux.item() == 0.0 and counts is None
    single = pyramid_layers(HIDDEN, mlp, 4, num_layers=3)
    assert [layer.num_experts for layer in single] == [4, 4, 4] and not single[0].use_residual
    assert pyramid_layers(HIDDEN, mlp, [8], ep_size=16)[0].ep_size == 8  # fewer experts than ranks


def test_a_pyramid_trains_through_every_layer():
    torch.manual_seed(0)
    layers = pyramid_layers(HIDDEN, mlp, [2, 4], mlp_type="residual", min_capacity=0, use_rts=False).double()
    x = torch.randn(10, HIDDEN, dtype=torch.float64)
    total_aux = 0
    for layer in layers:
        x, l_aux, _ = layer(x)
        total_aux = total_aux + l_aux
    (x.pow(2).mean() + 0.01 * total_aux).backward()
    for name, param in layers.named_parameters():
        if "deepspeed_experts" not in name:  # an expert that got no token has no gradient
            assert param.grad is not None, name
    assert layers[1].coefficient.weight.grad.abs().sum() > 0  # the residual mix is learned


def test_bad_pyramids_are_refused():
    with pytest.raises(MoEError, match=r"lists 2 count\(s\) \[2, 4\] for 3 MoE layer"):
        pyramid_layers(HIDDEN, mlp, [2, 4], num_layers=3)
    with pytest.raises(MoEError, match="mlp_type='dense'"):
        pyramid_layers(HIDDEN, mlp, [2], mlp_type="dense")
    with pytest.raises(MoEError, match="every count must be a positive integer"):
        dsmoe.expand_num_experts([2, 0], 2)


def test_distillation_loss_is_the_temperature_scaled_kl_per_token():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64)
    temperature = 2.0
    loss = distillation_loss(student, teacher, temperature)
    p = torch.softmax(teacher / temperature, dim=-1)
    q = torch.softmax(student / temperature, dim=-1)
    by_hand = (p * (p.log() - q.log())).sum(dim=-1).mean() * temperature**2  # mean over the 6 tokens
    torch.testing.assert_close(loss, by_hand.float(), rtol=1e-6, atol=1e-7)
    # Megatron-DeepSpeed's: T^2 x KLDivLoss(batchmean) over [batch, seq, vocab] / seq_length
    megatron = temperature**2 * F.kl_div(F.log_softmax(student / temperature, dim=2), p, reduction="batchmean") / 3
    torch.testing.assert_close(loss, megatron.float(), rtol=1e-6, atol=1e-7)
    loss.backward()
    assert student.grad is not None
    assert distillation_loss(teacher, teacher).item() == pytest.approx(0.0, abs=1e-6)


def test_mixture_of_students_distills_until_the_stop_step_then_trains_on_the_lm_loss_alone():
    torch.manual_seed(0)
    teacher = torch.nn.Linear(4, 6)
    mos = MixtureOfStudents(teacher, temperature=1.5, kd_weight=0.5, stop_step=3)
    assert not any(p.requires_grad for p in teacher.parameters()) and not teacher.training
    x = torch.randn(2, 3, 4)
    student_logits = torch.randn(2, 3, 6, requires_grad=True)
    lm_loss = torch.tensor(2.0)
    early = mos.loss(lm_loss, student_logits, 2, x)
    expected = lm_loss + 0.5 * distillation_loss(student_logits, teacher(x).detach(), 1.5)
    torch.testing.assert_close(early, expected)
    assert mos.loss(lm_loss, student_logits, 3, x) is lm_loss  # step 3 onwards: the LM loss alone
    assert mos.distilling(2) and not mos.distilling(3)
    with pytest.raises(MoEError, match="stop_step=-1"):
        MixtureOfStudents(teacher, stop_step=-1)
    with pytest.raises(MoEError, match="same shape"):
        distillation_loss(torch.zeros(2, 5), torch.zeros(2, 6))


def test_expert_files_follow_deepspeeds_names_and_reload_at_another_ep_size():
    torch.manual_seed(0)
    whole = MoE(HIDDEN, mlp(), num_experts=4, ep_size=1)
    for i, expert in enumerate(whole.deepspeed_moe.experts.deepspeed_experts):
        torch.nn.init.constant_(expert[0].weight, float(i))
    files = dsmoe.local_expert_states(torch.nn.ModuleDict({"moe": whole}))
    assert sorted(files) == [f"layer_0_expert_{e}_mp_rank_00_model_states" for e in range(4)]
    assert sorted(files["layer_0_expert_2_mp_rank_00_model_states"]) == [
        "moe.deepspeed_moe.experts.deepspeed_experts.2.0.bias", "moe.deepspeed_moe.experts.deepspeed_experts.2.0.weight",
        "moe.deepspeed_moe.experts.deepspeed_experts.2.2.bias", "moe.deepspeed_moe.experts.deepspeed_experts.2.2.weight"]
    half = MoE(HIDDEN, mlp(), num_experts=4, ep_size=2)
    half.deepspeed_moe.experts.deepspeed_experts.renumber(2)  # ep rank 1 of 2 holds experts 2 and 3
    model = torch.nn.ModuleDict({"moe": half})
    missing = dsmoe.load_local_experts(model, lambda name: files[name])
    assert missing == []
    assert half.deepspeed_moe.experts.deepspeed_experts[0][0].weight.unique().tolist() == [2.0]
    assert half.deepspeed_moe.experts.deepspeed_experts[1][0].weight.unique().tolist() == [3.0]
    with pytest.raises(MoEError, match="layer_0_expert_2_mp_rank_00_model_states: does not match"):
        dsmoe.load_local_experts(model, lambda name: {})
