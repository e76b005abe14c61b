"""The Hybrid Engine: an actor that generates between training steps (DeepSpeed-Chat's calling pattern)
yields exactly the tokens of the whole model, at ZeRO-3 with one gather per call, tensor-parallel, with
LoRA fused; and training after generation is bit-identical to training that never generated."""

import warnings

import pytest
import torch
from hybrid_models import config, family, llama, merged, prompts, with_lora

import dstrain
import dszero
from dscomm.testing import run_ranks

transformers = pytest.importorskip("transformers")

VARIANTS = [(3, {}), (3, {"pin_parameters": False}), (3, {"release_inference_cache": True}), (2, {})]


def _greedy(model, ids, new=6):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                          pad_token_id=0)


def generate_as_deepspeed_chat(rank, world, lengths):
    reference = llama()
    ids = prompts(rank, length=lengths[rank])
    expected = _greedy(reference, ids)
    results = []
    for stage, hybrid in VARIANTS:
        engine, *_ = dstrain.initialize(model=llama(), config=config(stage, **hybrid))
        units = getattr(engine.optimizer.reducer, "units", [])
        controls = dszero.CompilerControls(engine.optimizer)
        hooks_during = []  # stage 3's gathering hooks, seen from inside a layer's forward while generating
        seen = engine.module.model.layers[0].register_forward_hook(
            lambda *_, seen=hooks_during, controls=controls: seen.append(controls.module_hooks_on))
        engine.eval()
        before = sum(u.gather_count for u in units)
        out = engine.module.generate(ids, attention_mask=torch.ones_like(ids), max_length=ids.shape[1] + 6,
                                     pad_token_id=0, do_sample=False, synced_gpus=False)
        gathers = sum(u.gather_count for u in units) - before
        seen.remove()
        hooks = (any(hooks_during), controls.module_hooks_on)
        also = engine.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        engine.train()
        released = sum(p.numel() for p in engine.module.parameters()) if stage == 3 else 0
        results.append((torch.equal(out, expected), torch.equal(also, expected), gathers, len(units), released,
                        hooks))
        engine.destroy()
    return results


def test_generation_yields_the_whole_models_tokens_at_every_stage_and_variant():
    lengths = (5, 7)  # prompts of different lengths on each rank
    for rank_results in run_ranks(generate_as_deepspeed_chat, 2, lengths, timeout=300):
        for (stage, hybrid), (same, also_same, gathers, units, released, hooks) in zip(VARIANTS, rank_results):
            assert same and also_same, (stage, hybrid)
            assert released == 0, (stage, hybrid)
            if stage == 3 and hybrid.get("pin_parameters", True):
                assert gathers == units == 21  # every unit once for the call, none per token
                assert hooks == (False, True)  # off while every weight is held, back for training
            elif stage == 3:
                assert hooks == (True, True)  # gathered layer by layer: the hooks do it


FAMILIES = ["opt", "gpt2", "qwen2", "mistral"]


def generate_each_family(rank, world):
    results = {}
    for name in FAMILIES:
        ids = prompts(rank, length=4 + rank)
        expected = _greedy(family(name).eval(), ids)  # OPT and GPT-2 have dropout: off, as engine.eval() turns it
        engine, *_ = dstrain.initialize(model=family(name), config=config(3))
        engine.eval()
        out = engine.module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                     pad_token_id=0, synced_gpus=True)
        engine.train()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        results[name] = (torch.equal(out, expected), bool(torch.isfinite(loss)))
        engine.destroy()
    return results


def test_other_model_families_generate_the_whole_models_tokens_at_zero_3():
    # The reference names Llama, OPT, Qwen, Mistral and GPT-2 among the models whose own generate() it drives.
    for rank_results in run_ranks(generate_each_family, 2, timeout=300):
        assert rank_results == {name: (True, True) for name in FAMILIES}


def generate_tensor_parallel(rank, world):
    reference = llama()
    ids = prompts(rank, rows=1 + rank)  # a different number of prompts on each rank of the group
    results = []
    layer = sum(p.numel() for p in reference.model.layers[0].parameters())
    for stage, partition in ((3, 1), (1, 8)):
        engine, *_ = dstrain.initialize(model=llama(), config=config(stage, inference_tp_size=2,
                                                                     tp_gather_partition_size=partition))
        engine.eval()
        out = engine.module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                     pad_token_id=0)
        replica = engine._hybrid.replica
        shard = tuple(replica.replica.model.layers[0].self_attn.q_proj.weight.shape)
        results.append((torch.equal(out, _greedy(reference, ids)), shard, replica.peak_whole_numel, layer))
        engine.destroy()
    return results


def test_tensor_parallel_generation_yields_the_whole_models_tokens():
    for rank_results in run_ranks(generate_tensor_parallel, 2, timeout=300):
        (same, shard, peak, layer), (same_too, _, peak_all, _) = rank_results
        assert same and same_too
        assert shard == (16, 32)  # q_proj cut over the two ranks of the inference group
        # tp_gather_partition_size 1: one decoder layer whole at a time (the embedding and head come last, alone)
        assert peak < peak_all and peak == max(layer, 64 * 32)


def lora_generation(rank, world):
    results = []
    for stage, tp in ((3, 1), (0, 1), (3, 2)):
        model = with_lora(llama())
        reference = merged(model)
        engine, *_ = dstrain.initialize(model=model, config=config(stage, inference_tp_size=tp))
        ids = prompts(rank)
        before = _weights(engine)
        out = engine.module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                     pad_token_id=0)
        after = _weights(engine)
        flags = [m.fuse_lora for m in engine.module.modules() if hasattr(m, "fuse_lora")]
        results.append((torch.equal(out, _greedy(reference, ids)),
                        all(torch.equal(before[k], after[k]) for k in before), len(flags), any(flags)))
        engine.destroy()
    return results


def _weights(engine):
    with dszero.GatheredParameters(list(engine.module.parameters())):
        return {k: v.detach().clone() for k, v in engine.module.named_parameters()}


def test_lora_is_fused_for_generation_and_exactly_unfused_after():
    for rank_results in run_ranks(lora_generation, 2, timeout=300):
        for same, unchanged, lora_layers, still_fused in rank_results:
            assert same and unchanged and lora_layers == 4 and not still_fused


def lora_frozen_under_init(rank, world):
    """DeepSpeed-Chat's --only_optimize_lora at ZeRO-3 on a model partitioned by zero.Init (as from_pretrained
    under HfDeepSpeedConfig): the frozen base weights stay partitioned, generation fuses LoRA into them."""
    reference = merged(with_lora(llama()))
    model = llama()
    dstrain.zero.Init(module=model, config_dict_or_path=config(3))
    model = with_lora(model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    engine, *_ = dstrain.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                    config=config(3))
    ids = prompts(rank)
    results = []
    for step in range(2):
        engine.eval()
        out = engine.module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                     pad_token_id=0)
        engine.train()
        batch = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(rank + step))
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
        frozen_held = sum(p.numel() for n, p in engine.module.named_parameters() if "lora_" not in n)
        results.append((torch.equal(out, _greedy(reference, ids)) if step == 0 else True, frozen_held))
    from dstrain.compat.runtime.zero import unwrap_model_for_generation

    with unwrap_model_for_generation(engine) as unwrapped:  # TRL's way: every weight gathered, hooks off
        whole = all(p.numel() > 0 for p in unwrapped.module.parameters())
    after = sum(p.numel() for n, p in engine.module.named_parameters() if "lora_" not in n)
    results.append((whole, after))
    return results, len(engine.optimizer.reducer.frozen)


def test_lora_over_frozen_weights_partitioned_by_init_generates_and_trains():
    for results, frozen_units in run_ranks(lora_frozen_under_init, 2, timeout=300):
        assert frozen_units > 0
        for same, frozen_held in results:
            assert same and frozen_held == 0  # the base weights back in their shards after every step


def train_steps(rank, world, generate):
    engine, *_ = dstrain.initialize(model=llama(), config=config(3, enabled=generate))
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for step in range(3):
        if generate:  # sampled, different lengths per rank: it draws random numbers and runs unequal forwards
            engine.eval()
            ids = prompts(rank + step)
            engine.module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4 + rank, do_sample=True,
                                   pad_token_id=0)
            engine.train()
        batch = torch.randint(3, 64, (2, 9), generator=gen)
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with dszero.GatheredParameters(list(engine.module.parameters())):
        weights = {k: v.detach().clone() for k, v in engine.module.named_parameters()}
    split = engine._hybrid.latency.last if generate else None
    return losses, weights, torch.rand(1).item(), engine.global_steps, split


def test_training_after_generation_is_bit_identical_to_training_without_it():
    plain = run_ranks(train_steps, 2, False, timeout=180)
    mixed = run_ranks(train_steps, 2, True, timeout=180)
    for (losses, weights, draw, steps, _), (losses2, weights2, draw2, steps2, split) in zip(plain, mixed):
        assert losses == losses2 and draw == draw2 and steps == steps2 == 3
        assert all(torch.equal(weights[k], weights2[k]) for k in weights)
        assert split["generate_s"] > 0 and split["training_s"] > 0 and split["e2e_latency_s"] > 0


def refusals(rank, world):
    import transformers

    odd = transformers.LlamaConfig(hidden_size=36, intermediate_size=48, num_hidden_layers=1, num_attention_heads=3,
                                   num_key_value_heads=3, vocab_size=64)
    cases = [(lambda: torch.nn.Linear(4, 4), {}), (llama, {"max_out_tokens": 10}),
             (llama, {"inference_tp_size": 3}), (lambda: transformers.AutoModelForCausalLM.from_config(odd),
                                                 {"inference_tp_size": 2})]
    messages = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dstrain.initialize(model=llama(), config=config(2, enable_cuda_graph=True))
    messages.append(" ".join(str(w.message) for w in caught))
    for build, hybrid in cases:
        try:
            engine, *_ = dstrain.initialize(model=build(), config=config(3, **hybrid))
            engine.module.generate(prompts(rank), max_new_tokens=8, pad_token_id=0)
        except dstrain.ConfigError as exc:
            messages.append(str(exc))
        else:
            messages.append(None)
    return messages


def test_each_refusal_names_its_key():
    expected = [("hybrid_engine.enable_cuda_graph", "without CUDA"), ("hybrid_engine.enabled", "generate()"), ("hybrid_engine.max_out_tokens", "13 tokens"),
                ("hybrid_engine.inference_tp_size", "divide the data-parallel size 2"),
                ("hybrid_engine.inference_tp_size", "cannot cut")]
    for messages in run_ranks(refusals, 2, timeout=180):
        for message, (key, words) in zip(messages, expected):
            assert message is not None and key in message and words in message, message
