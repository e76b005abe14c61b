"""initialize() with "expert_parallel": {"enabled": true, "autoep_size": N}: AutoEP swaps a tiny
Hugging Face Mixtral's MoE blocks before the optimizer is built, ZeRO reduces the experts over
their expert-data group, and training on 2 gloo ranks equals one process running both ranks'
batches through the unswapped model (losses, gradient norms, weights; AdamW, clipping) at
autoep_size 1 and 2 and ZeRO stages 0, 1 and 2. Checkpoints saved at autoep_size 2 load at
autoep_size 1 (files per global expert), and save_16bit_model loads back into the HF class.
"""

import copy

import pytest
import torch

import dstrain
from dscomm.testing import run_ranks

pytest.importorskip("transformers")

VOCAB, SEQ = 64, 6


class M:
    """A tiny Mixtral from its config (nothing downloaded), with weights large enough to route unevenly."""

    @staticmethod
    def build(kind="mixtral", seed=0):
        from transformers import MixtralConfig, MixtralForCausalLM
        torch.manual_seed(seed)
        model = MixtralForCausalLM(MixtralConfig(
            vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2,
            output_router_logits=True, router_aux_loss_coef=0.01, tie_word_embeddings=False))
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() > 1:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        return model

    @staticmethod
    def batch(seed, rows=2):
        ids = torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(seed))
        return {"input_ids": ids, "labels": ids}

WORLD, STEPS, CLIP, LR = 2, 3, 0.5, 0.01
# (autoep_size, stage, what the optimizer is built from)
RUNS = [(1, 1, "config"), (2, 0, "config"), (2, 1, "client"), (2, 2, "config"), (2, 2, "groups")]


def config(ep, stage, optimizer=True):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": CLIP,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 500}, "steps_per_print": 1000,
           "expert_parallel": {"enabled": True, "autoep_size": ep, "preset_model": "mixtral"}}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}
    return cfg


def reference():
    """Both ranks' batches through the unswapped model: the mean loss, AdamW, clipping."""
    model = M.build("mixtral")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        total = 0.0
        for rank in range(WORLD):
            loss = model(**M.batch(10 * step + rank)).loss / WORLD
            loss.backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}


def train(rank, ep, stage, source):
    model = M.build("mixtral")
    if source == "config":
        engine, *_ = dstrain.initialize(model=model, config=config(ep, stage))
    elif source == "groups":  # param groups of the whole model: the engine puts the rank's experts in them
        groups = [{"params": list(model.parameters()), "name": "everything"}]
        engine, *_ = dstrain.initialize(model=model, model_parameters=groups, config=config(ep, stage))
    else:  # a client optimizer built from the whole model: the engine points it at the rank's experts
        client = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        engine, *_ = dstrain.initialize(model=model, optimizer=client, config=config(ep, stage, optimizer=False))
    losses, norms = [], []
    for step in range(STEPS):
        out = engine(**M.batch(10 * step + rank))
        engine.backward(out.loss)
        engine.step()
        total = out.loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / WORLD)
        norms.append(engine.get_global_grad_norm())
    layer = model.get_submodule("model.layers.0.mlp")
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}, \
        list(layer.local_experts.global_expert_ids())


def ranks(rank, world):
    return [train(rank, *run) for run in RUNS]


def test_autoep_engine_equals_one_process_at_every_size_and_stage():
    want_losses, want_norms, want_weights = reference()
    results = run_ranks(ranks, WORLD, timeout=240)
    for rank, per_run in enumerate(results):
        for (ep, stage, source), (losses, norms, weights, ids) in zip(RUNS, per_run, strict=True):
            where = f"rank {rank}, autoep_size {ep}, stage {stage}, {source}"
            assert ids == ([0, 1, 2, 3] if ep == 1 else [2 * rank, 2 * rank + 1]), where
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6,
                                       msg=where)
            torch.testing.assert_close(torch.tensor(norms), torch.tensor(want_norms), rtol=1e-5, atol=1e-6,
                                       msg=where)
            for name, weight in weights.items():
                want = want_weights[name]
                if weight.shape != want.shape:  # this rank's experts of the stacked weight
                    want = want[ids[0]:ids[-1] + 1]
                # Adam turns rounding in a near-zero gradient into up to lr-sized steps: atol 2e-4 (the
                # gradient scale itself is checked exactly through the clipped norms above)
                torch.testing.assert_close(weight, want, rtol=1e-4, atol=2e-4, msg=f"{where}: {name}")


def checkpoints(rank, world, root):
    model = M.build("mixtral")
    engine, *_ = dstrain.initialize(model=model, config=config(2, 1))
    for step in range(2):
        out = engine(**M.batch(step + rank))
        engine.backward(out.loss)
        engine.step()
    engine.save_checkpoint(root / "ckpt", tag="t")
    engine.save_16bit_model(root / "hf", "pytorch_model.bin")
    probe = M.batch(99)
    mine = engine.module(**probe).loss.detach()
    torch.distributed.barrier()
    # the same autoep_size; then autoep_size 1, where every rank holds all 4 experts (the module's from
    # the per-expert files; ZeRO's masters and moments put back together by expert), and module only
    same, *_ = dstrain.initialize(model=M.build("mixtral", seed=5), config=config(2, 1))
    same.load_checkpoint(root / "ckpt", tag="t")
    reloaded_same = same.module(**probe).loss.detach()
    reloaded = []
    for module_only in (False, True):
        engine1, *_ = dstrain.initialize(model=M.build("mixtral", seed=6), config=config(1, 1))
        engine1.load_checkpoint(root / "ckpt", tag="t", load_module_only=module_only)
        reloaded.append(engine1.module(**probe).loss.detach())
    return mine, (reloaded_same, *reloaded), sorted(p.name for p in (root / "ckpt" / "t").iterdir() if "expert" in p.name)


def wider(rank, world, root, ep):
    """The 2-rank autoep_size-2 checkpoint in a 4-rank run at autoep_size `ep`: the experts' slices of
    every saved expert-data group put back together by expert (ZeRO alone would find them by name,
    which each group saved alike), weights and Adam's moments; then one more step on every rank's batch."""
    engine, *_ = dstrain.initialize(model=M.build("mixtral", seed=7), config=config(ep, 1))
    engine.load_checkpoint(root / "ckpt", tag="t")
    loss = engine.module(**M.batch(99)).loss.detach()
    out = engine(**M.batch(50 + rank))
    engine.backward(out.loss)
    engine.step()
    return loss, engine.global_steps, _gathered(engine)


def _gathered(engine):
    """Every weight whole (AutoEP's experts gathered over their expert-parallel group)."""
    from dsmoe import autoep
    return {k: v.clone() for k, v in autoep.full_expert_state_dict(engine.module).items()}


def continued(rank, world, root):
    """The reference for `wider`: the same checkpoint at its own layout, and the same next step over the
    4 batches (2 per rank, accumulated: the same mean as 4 ranks' one each)."""
    cfg = config(2, 1)
    cfg["gradient_accumulation_steps"] = 2
    engine, *_ = dstrain.initialize(model=M.build("mixtral", seed=7), config=cfg)
    engine.load_checkpoint(root / "ckpt", tag="t")
    for micro in range(2):
        out = engine(**M.batch(50 + 2 * rank + micro))
        engine.backward(out.loss)
        engine.step()
    return _gathered(engine)


def test_checkpoint_reloads_at_another_autoep_size_and_16bit_model_loads_into_the_hf_class(tmp_path):
    results = run_ranks(checkpoints, WORLD, tmp_path, timeout=240)
    (mine0, reloaded0, files), (mine1, reloaded1, _) = results
    assert len(files) == 2 * 4, files  # 2 MoE layers x 4 global experts
    for mine, reloaded in ((mine0, reloaded0), (mine1, reloaded1)):
        for loss in reloaded:
            torch.testing.assert_close(loss, mine, rtol=1e-6, atol=1e-6)
    hf = M.build("mixtral", seed=9)
    hf.load_state_dict(torch.load(tmp_path / "hf" / "pytorch_model.bin", weights_only=True))  # strict
    torch.testing.assert_close(hf(**M.batch(99)).loss.detach(), mine0, rtol=1e-6, atol=1e-6)
    assert copy.deepcopy(hf).model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
    want = run_ranks(continued, 2, tmp_path, timeout=240)[0]
    for ep in (2, 4):
        for loss, steps, weights in run_ranks(wider, 4, tmp_path, ep, timeout=240):
            torch.testing.assert_close(loss, mine0, rtol=1e-6, atol=1e-6)
            assert steps == 3
            for name, weight in want.items():  # Adam's moments came back with the right experts
                torch.testing.assert_close(weights[name], weight, rtol=1e-4, atol=2e-5, msg=f"autoep {ep}: {name}")


def refusals(rank, world):
    found = {}
    for name, cfg in (("size", config(3, 1)), ("no_moe", config(1, 1))):
        model = torch.nn.Linear(4, 4) if name == "no_moe" else M.build("mixtral")
        try:
            dstrain.initialize(model=model, config=cfg)
            found[name] = None
        except Exception as exc:  # the message must name the key, whatever the class
            found[name] = f"{type(exc).__name__}: {exc}"
    return found


def test_what_autoep_cannot_do_is_refused_naming_the_key():
    found = run_ranks(refusals, WORLD, timeout=120)[0]
    assert "expert_parallel.autoep_size" in found["size"], found
    assert "expert_parallel" in found["no_moe"] and "no module matches" in found["no_moe"], found
