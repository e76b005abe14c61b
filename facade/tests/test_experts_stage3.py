"""Experts at ZeRO stage 3: AutoEP (a tiny Hugging Face Mixtral) and dsmoe's MoE layer on 4 gloo ranks, the dense
parameters partitioned over the data-parallel group (4 ranks) and each expert over its expert-data group (the 2
ranks holding it at expert-parallel size 2), gathered for the expert compute, released after and prefetched like
any other unit. Training equals stage 0 and one process (losses, clipped gradient norms, weights); a stage-3
checkpoint is saved partition-natively and reloads at the same layout (whole, module-only, without the optimizer's
state) and, read whole, at another data-parallel size and autoep_size; save_16bit_model gathers the experts for
the Hugging Face class; each of the reference's constraints on AutoEP at stage 3 is refused by its key."""

import pytest
import torch
from moe_models import TinyMoELM, batch, distinct_experts, seed_gate

import dstrain
from dscomm.testing import run_ranks

pytest.importorskip("transformers")

WORLD, STEPS, CLIP, LR, VOCAB, SEQ = 4, 3, 0.5, 0.01, 64, 6


def mixtral(seed=0, aux=True):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2,
        output_router_logits=aux, router_aux_loss_coef=0.01, tie_word_embeddings=False))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # weights large enough to route unevenly
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


def tokens(step, replica):
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(100 * step + replica))
    return {"input_ids": ids, "labels": ids}


def config(stage, ep=2, **zero):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": CLIP,
            "steps_per_print": 1000, "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                  "stage3_gather_16bit_weights_on_model_save": True, **zero},
            "expert_parallel": {"enabled": True, "autoep_size": ep, "preset_model": "mixtral"}}


def whole(engine):
    """Every weight whole: stage 3's units gathered, AutoEP's experts gathered over their group."""
    import dszero
    from dsmoe import autoep

    with dszero.GatheredParameters(list(engine.module.parameters())):
        return {k: v.detach().clone() for k, v in autoep.full_expert_state_dict(engine.module).items()}


def train_autoep(engine, steps, replica, data):
    losses, norms = [], []
    for step in steps:
        out = engine(**tokens(step, replica))
        engine.backward(out.loss)
        engine.step()
        total = out.loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / data)
        norms.append(engine.get_global_grad_norm())
    return losses, norms


def plain_reference():
    """One process, every replica's batch through the unswapped model: mean losses, clipped norms, weights."""
    model = mixtral()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        total = 0.0
        for replica in range(WORLD):
            loss = model(**tokens(step, replica)).loss / WORLD
            loss.backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------------- training
def autoep_runs(rank, world):
    results = {}
    for stage in (3, 0):
        engine, *_ = dstrain.initialize(model=mixtral(), config=config(stage))
        losses, norms = train_autoep(engine, range(STEPS), rank, world)
        facts = {}
        if stage == 3:
            units = engine.optimizer.groups
            experts = [u for u in units if any(".experts." in n for n in u.names)]
            dense = [u for u in units if u not in experts]
            layer = engine.module.get_submodule("model.layers.0.mlp")
            facts = {"expert_group": {torch.distributed.get_world_size(u.group) for u in experts},
                     "dense_group": {torch.distributed.get_world_size(u.group) for u in dense},
                     "released": all(p.numel() == 0 for p in layer.local_experts.parameters()),
                     "expert_prefetches": sum(u.prefetch_count for u in experts),
                     "expert_shard": sum(u.shard_numel for u in experts),
                     "expert_whole": sum(p.ds_numel for u in experts for p in u.params)}
        results[stage] = losses, norms, whole(engine), facts
    return results


def test_autoep_at_zero_3_equals_zero_0_and_one_process():
    want_losses, want_norms, want_weights = plain_reference()
    for rank, results in enumerate(run_ranks(autoep_runs, WORLD, timeout=300)):
        for stage, (losses, norms, weights, _) in results.items():
            where = f"rank {rank}, ZeRO-{stage}"
            torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=0, msg=where)
            torch.testing.assert_close(norms, want_norms, rtol=1e-5, atol=0, msg=where)
            for name, value in weights.items():
                # Adam turns rounding in a near-zero gradient into a visible step (AutoEP routes in float32)
                torch.testing.assert_close(value, want_weights[name], rtol=1e-4, atol=2e-4, msg=f"{where}: {name}")
        stage3, stage0 = results[3], results[0]
        torch.testing.assert_close(stage3[0], stage0[0], rtol=1e-5, atol=0)
        for name, value in stage3[2].items():
            torch.testing.assert_close(value, stage0[2][name], rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")
        facts = stage3[3]
        # experts over their expert-data group (2 ranks hold each), dense weights over all 4 ranks
        assert facts["expert_group"] == {2} and facts["dense_group"] == {4}, facts
        assert facts["released"], facts  # released after the expert compute
        assert 2 * facts["expert_shard"] >= facts["expert_whole"] > facts["expert_shard"], facts
        assert facts["expert_prefetches"] > 0, facts  # gathered ahead of their use after the first step


def family_model(family, seed=0):
    """A tiny Qwen3-MoE, or DeepSeek-V3 (group-limited sigmoid routing, a shared expert, a dense first layer and a
    non-zero e_score_correction_bias buffer), from configs."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32, num_experts_per_tok=2,
                  output_router_logits=True, router_aux_loss_coef=0.01, tie_word_embeddings=False)
    if family == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, num_key_value_heads=1, num_experts=4, head_dim=8,
                                                   norm_topk_prob=True))
    else:
        model = DeepseekV3ForCausalLM(DeepseekV3Config(
            **common, num_key_value_heads=2, n_routed_experts=8, n_group=4, topk_group=2, n_shared_experts=1,
            first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=8,
            q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.rand(buffer.shape, generator=generator) * 0.5)
    return model


def family_runs(rank, world):
    results = {}
    for family in ("qwen3_moe", "deepseek_v3"):
        for stage in (3, 0):
            cfg = config(stage)
            cfg["expert_parallel"]["preset_model"] = family
            engine, *_ = dstrain.initialize(model=family_model(family), config=cfg)
            losses, norms = train_autoep(engine, range(2), rank, world)
            units = engine.optimizer.groups if stage == 3 else []
            expert_groups = {torch.distributed.get_world_size(u.group) for u in units
                             if any(".experts." in n for n in u.names)}
            results[family, stage] = losses, norms, whole(engine), expert_groups
    return results


def test_qwen3_moe_and_deepseek_v3_at_zero_3_equal_zero_0():
    """The other families' blocks at stage 3 on 2 ranks (autoep_size 2: each expert on one rank, its expert-data
    group of 1): Qwen3-MoE's normalised top-k, DeepSeek-V3's shared expert (a dense weight, partitioned over the
    data-parallel group), its dense first layer and its routing bias."""
    for rank, results in enumerate(run_ranks(family_runs, 2, timeout=300)):
        for family in ("qwen3_moe", "deepseek_v3"):
            (losses3, norms3, weights3, groups), (losses0, norms0, weights0, _) = results[family, 3], results[family, 0]
            where = f"rank {rank}, {family}"
            assert groups == {1}, (where, groups)
            torch.testing.assert_close(losses3, losses0, rtol=1e-5, atol=0, msg=where)
            torch.testing.assert_close(norms3, norms0, rtol=1e-5, atol=0, msg=where)
            assert weights3.keys() == weights0.keys(), where
            for name, value in weights3.items():
                # as against one process above: Adam turns rounding in a near-zero gradient into a visible step
                torch.testing.assert_close(value, weights0[name], rtol=1e-4, atol=2e-4, msg=f"{where}: {name}")


def dsmoe_runs(rank, world):
    results = {}
    for stage in (3, 0):
        model = TinyMoELM(ep_size=2)
        engine, *_ = dstrain.initialize(model=model, config={**config(stage), "expert_parallel": {}})
        distinct = {}
        if stage == 3:  # the experts differ by global id, on whichever rank holds them
            import dszero

            with dszero.GatheredParameters(list(model.parameters()), modifier_rank=0):
                distinct_experts(model)
        else:
            distinct_experts(model)
            engine.optimizer.masters_from_module()
        losses = []
        for step in range(STEPS):
            seed_gate(model, step, rank)
            loss = engine(batch(step, rank))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        import dszero

        with dszero.GatheredParameters(list(model.parameters())):
            distinct = {n: p.detach().clone() for n, p in model.named_parameters()}
        results[stage] = losses, distinct
    return results


def test_a_dsmoe_layer_at_stage_3_equals_stage_0():
    for rank, results in enumerate(run_ranks(dsmoe_runs, WORLD, timeout=300)):
        (losses3, weights3), (losses0, weights0) = results[3], results[0]
        torch.testing.assert_close(losses3, losses0, rtol=1e-5, atol=0, msg=f"rank {rank}")
        assert weights3.keys() == weights0.keys()
        for name, value in weights3.items():
            torch.testing.assert_close(value, weights0[name], rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")


# ---------------------------------------------------------------------------------------------- checkpoints
def saver(rank, world, root):
    engine, *_ = dstrain.initialize(model=mixtral(aux=False), config=config(3))
    train_autoep(engine, range(2), rank, world)
    engine.save_checkpoint(root / "ckpt", tag="t", client_state={"epoch": 1})
    engine.save_16bit_model(root / "hf", "pytorch_model.bin")
    probe = engine.module(**tokens(99, 0)).loss.item()
    train_autoep(engine, [2], rank, world)
    return probe, engine.module(**tokens(99, 0)).loss.item()


def same_topology(rank, world, root):
    found = {}
    for name, options in (("whole", {}), ("module_only", {"load_module_only": True}),
                          ("no_optimizer", {"load_optimizer_states": False})):
        engine, *_ = dstrain.initialize(model=mixtral(seed=5, aux=False), config=config(3))
        engine.load_checkpoint(root / "ckpt", tag="t", **options)
        probe = engine.module(**tokens(99, 0)).loss.item()
        steps = engine.global_steps
        train_autoep(engine, [2], rank, world)
        found[name] = probe, engine.module(**tokens(99, 0)).loss.item(), steps
    return found


def elsewhere(rank, world, root, ep):
    """2 ranks (data-parallel size 2, not 4) at autoep_size `ep`: the stage-3 checkpoint read whole (through
    load_checkpoint, or read_whole / load_whole as a conversion script would)."""
    from dstrain.checkpoint import load_whole, read_whole

    engine, *_ = dstrain.initialize(model=mixtral(seed=7, aux=False), config=config(3, ep))
    if ep == 1:  # what a script does: load_checkpoint sees another layout and reads the checkpoint whole
        _, client = engine.load_checkpoint(root / "ckpt", tag="t")
    else:
        client = load_whole(engine._parts, read_whole(root / "ckpt" / "t"))
    probe = engine.module(**tokens(99, 0)).loss.item()
    return probe, client, engine.global_steps


def test_a_stage_3_checkpoint_reloads_at_the_same_topology_and_read_whole_elsewhere(tmp_path):
    probe, after = run_ranks(saver, WORLD, tmp_path, timeout=300)[0]
    saved = tmp_path / "ckpt" / "t"
    assert not [p for p in saved.rglob("*expert*")], "stage 3 saves the experts partition-natively (no expert files)"
    for found in run_ranks(same_topology, WORLD, tmp_path, timeout=300):
        for name, (loaded, _, _) in found.items():
            assert loaded == pytest.approx(probe, rel=1e-6), name
        # the moments came back: the same step after the load; without them (module only, or skipped) another
        assert found["whole"][1] == pytest.approx(after, rel=1e-6)
        assert found["module_only"][1] != pytest.approx(after, rel=1e-6)
        assert found["no_optimizer"][1] != pytest.approx(after, rel=1e-6)
        assert (found["whole"][2], found["module_only"][2], found["no_optimizer"][2]) == (2, 0, 2)
    for ep in (2, 1):
        for loaded, client, steps in run_ranks(elsewhere, 2, tmp_path, ep, timeout=300):
            assert loaded == pytest.approx(probe, rel=1e-6), ep
            assert steps == 2 and client == {"epoch": 1}
    hf = mixtral(seed=9, aux=False)
    hf.load_state_dict(torch.load(tmp_path / "hf" / "pytorch_model.bin", weights_only=True))  # strict
    assert hf(**tokens(99, 0)).loss.item() == pytest.approx(probe, rel=1e-6)


# ---------------------------------------------------------------------------------------------- refusals
REFUSED = {  # the reference's constraints on AutoEP at ZeRO stage 3, each by the key that breaks it
    "tensor_parallel.autotp_size": {"tensor_parallel": {"autotp_size": 2}},
    "zero_optimization.zero_hpz_partition_size": {"zero": {"zero_hpz_partition_size": 2}},
    "zero_optimization.zero_quantized_gradients": {"zero": {"zero_quantized_gradients": True}},
    "expert_parallel.expert_tensor_parallel_size": {"ep": {"expert_tensor_parallel_size": 2}},
    "sequence_parallel_size": {"sequence_parallel_size": 2},
}


def refusals(rank, world):
    found = {}
    for key, change in REFUSED.items():
        cfg = config(3)
        cfg["zero_optimization"].update(change.pop("zero", {}))
        cfg["expert_parallel"].update(change.pop("ep", {}))
        cfg.update(change)
        try:
            dstrain.initialize(model=mixtral(), config=cfg)
            found[key] = None
        except (dstrain.ConfigError, dstrain.UnsupportedFeatureError) as exc:
            found[key] = str(exc)
    return found


def test_each_of_the_references_stage_3_constraints_is_refused_by_its_key():
    for key, message in run_ranks(refusals, 2, timeout=120)[0].items():
        assert message is not None and key in message, (key, message)
    # and nothing else: AutoEP at stage 3 itself trains (test_autoep_at_zero_3_equals_zero_0_and_one_process)


def released_in_backward(rank, world):
    # Nothing kept for reuse or prefetched: every unit is gathered only while its module runs.
    engine, *_ = dstrain.initialize(model=mixtral(), config=config(3, ep=1, stage3_max_reuse_distance=0,
                                                                  stage3_prefetch_bucket_size=0))
    units = engine.optimizer.groups
    last = {id(p) for p in engine.module.model.layers[-1].parameters()}
    seen = []  # at the first layer's backward: what the last layer (its experts and attention) has gathered
    engine.module.model.layers[0].register_full_backward_pre_hook(lambda m, g: seen.append(
        sum(u.gathered_bytes() for u in units if id(u.params[0]) in last)))
    for step in range(2):
        out = engine(**tokens(step, rank))
        engine.backward(out.loss)
        engine.step()
    return seen, [u.names[0] for u in units if "experts" in u.names[0]]


def test_autoep_at_zero_3_releases_a_layer_once_its_backward_is_done():
    # The experts are an optimizer group of their own; units are still reduced and released layer by layer
    # (they used to wait, gathered, for the first layer's unit of the other group until backward ended).
    for seen, experts in run_ranks(released_in_backward, 2, timeout=120):
        assert len(experts) == 2  # a unit of stacked experts per layer
        assert seen == [0, 0]
