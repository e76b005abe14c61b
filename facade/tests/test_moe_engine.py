"""initialize() with MoE layers: expert groups, ZeRO over them, and the refusals.

On 2 gloo ranks, a tiny language model with a 4-expert MoE layer trains through the engine at
ep_size 1 and 2, at ZeRO stages 0, 1 and 2 (AdamW, gradient clipping), against one process that runs
both ranks' batches ("DDP with experts": the mean over ranks, each expert counted once): losses,
gradient norms and every weight, found by its global expert name, agree.
"""

import pytest
import torch
from moe_models import TinyMoELM, batch, distinct_experts, reference, seed_gate

import dsmoe
import dstrain
from dscomm.testing import run_ranks

WORLD, STEPS, CLIP = 2, 4, 0.5

# (ep_size, zero stage, gradient clipping, optimizer from: "config" | "client" | "split")
RUNS = [(1, 1, CLIP, "config"), (2, 1, CLIP, "config"), (2, 2, CLIP, "client"), (2, 0, 0.0, "split"),
        (2, 2, 0.0, "config")]


def config(stage, clip, optimizer=True):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": clip,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 50}, "steps_per_print": 1000}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}
    return cfg


def train(rank, ep, stage, clip, source):
    model = TinyMoELM(ep_size=ep)
    if source == "config":
        engine, *_ = dstrain.initialize(model=model, config=config(stage, clip))
    else:
        if source == "client":  # plain parameters: the engine splits its groups as DeepSpeed's does
            params = model.parameters()
        else:  # the script splits them, as DeepSpeed's MoE tutorial does
            params = dstrain.moe.utils.split_params_into_different_moe_groups_for_optimizer(
                {"params": list(model.parameters()), "name": "dense"})
        client = torch.optim.AdamW(params, lr=0.05, weight_decay=0.01)
        engine, *_ = dstrain.initialize(model=model, optimizer=client, config=config(stage, clip, optimizer=False))
    with torch.no_grad():  # the reference's weights, each expert by its global name (after initialize named them)
        reference_model = TinyMoELM()
        distinct_experts(reference_model)
        state = reference_model.state_dict()
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])
        engine.optimizer.masters_from_module()
    losses, norms = [], []
    for step in range(STEPS):
        seed_gate(model, step, rank)
        loss = engine(batch(step, rank))
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / WORLD)
        norms.append(engine.get_global_grad_norm())
    ids = model.moe.global_expert_ids()
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}, ids


def ranks(rank, world):
    return [train(rank, *run) for run in RUNS]


def test_moe_engine_equals_ddp_with_experts_at_every_ep_size_and_stage():
    expected = {clip: reference(WORLD, STEPS, clip) for clip in (CLIP, 0.0)}
    results = run_ranks(ranks, WORLD, timeout=240)
    for rank, per_run in enumerate(results):
        for (ep, stage, clip, source), (losses, norms, weights, ids) in zip(RUNS, per_run, strict=True):
            want_losses, want_norms, want_weights = expected[clip]
            where = f"rank {rank}, ep {ep}, stage {stage}, {source}"
            assert ids == ([0, 1, 2, 3] if ep == 1 else [2 * rank, 2 * rank + 1]), where
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6,
                                       msg=where)
            # the norm counts every expert once, whichever rank holds it (DeepSpeed's clipping)
            torch.testing.assert_close(torch.tensor(norms), torch.tensor(want_norms), rtol=1e-5, atol=1e-6,
                                       msg=where)
            for name, weight in weights.items():
                torch.testing.assert_close(weight, want_weights[name], rtol=1e-4, atol=1e-5, msg=f"{where}: {name}")


def refusals(rank, world):
    found = {}
    for name, model, cfg in (("too_big", TinyMoELM(ep_size=4), config(1, 0.0)),):
        try:
            dstrain.initialize(model=model, config=cfg)
            found[name] = None
        except (dstrain.ConfigError, dsmoe.MoEError) as exc:
            found[name] = str(exc)
    return found


def test_an_impossible_ep_size_is_refused_with_the_reason():  # stage 3: test_experts_stage3.py
    found = run_ranks(refusals, WORLD, timeout=120)[0]
    assert "MoE layer 'moe': ep_size 4 does not divide the 2 data-parallel rank(s)" in found["too_big"]
    assert "valid ep_size values here: [1, 2]" in found["too_big"]


def test_moe_names_load_as_deepspeeds():
    from dstrain.moe.layer import MoE
    from dstrain.moe.sharded_moe import top1gating
    from dstrain.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

    assert MoE is dsmoe.MoE and is_moe_param is dsmoe.is_moe_param
    # DeepSpeed's top1gating signature (ep_group, sparse routes) over dsmoe's: the same gating for the same logits.
    logits = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)  # random token selection draws from the global generator
    ours = top1gating(logits, 1.0, 4)
    torch.manual_seed(1)
    for mine, theirs in zip(ours, dsmoe.top1gating(logits, 1.0, 4), strict=True):
        assert torch.equal(mine, theirs)
    assert split_params_into_different_moe_groups_for_optimizer is dsmoe.split_params_into_different_moe_groups_for_optimizer
    assert dstrain.moe.moe_aux_loss is dsmoe.moe_aux_loss


def low_precision(rank, world, precision, offload):
    model = TinyMoELM(ep_size=2)
    cfg = config(2, CLIP)
    cfg[precision] = {"enabled": True, **({"initial_scale_power": 8} if precision == "fp16" else {})}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    engine, *_ = dstrain.initialize(model=model, config=cfg)
    with torch.no_grad():
        reference_model = TinyMoELM()
        distinct_experts(reference_model)
        state = reference_model.state_dict()
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])
        engine.optimizer.masters_from_module()
    losses = []
    for step in range(STEPS):
        seed_gate(model, step, rank)
        loss = engine(batch(step, rank))
        engine.backward(loss)
        engine.step()
        total = loss.detach().float().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / WORLD)
    return losses, engine.skipped_steps


@pytest.mark.parametrize(("precision", "offload"), [("bf16", True), ("fp16", False)])
def test_experts_train_in_low_precision_and_with_optimizer_offload(precision, offload):
    want_losses, _, _ = reference(WORLD, STEPS, CLIP)
    for losses, skipped in run_ranks(low_precision, WORLD, precision, offload, timeout=180):
        assert skipped == 0
        # the same trajectory as float32, within what 8 (bf16) or 11 (fp16) mantissa bits allow
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=3e-2, atol=3e-2)
