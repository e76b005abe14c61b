"""AutoEP beside AutoTP (tensor_parallel.autotp_size 2), beyond the reference, which refuses the pair: attention and
the dense layers cut over the tensor group, the experts split either over the same tensor ranks (autoep_size equal
to autotp_size: no token moves, the shares are summed) or over data ranks (each tensor rank holding the same
experts). On 4 gloo ranks (tensor 2 x data 2) training equals one process running both replicas' batches through
the unswapped Mixtral (losses, clipped gradient norms, weights); a checkpoint reloads at the same layout, at tensor 1
x data 4 (the experts' slices of every tensor rank put back together) and module-only, and save_16bit_model loads
into the Hugging Face class."""

import pytest
import torch

import dscomm
import dstrain
from dscomm.testing import run_ranks

pytest.importorskip("transformers")

VOCAB, SEQ, ROWS = 64, 6, 4  # ROWS: the global batch of a step, split over the data-parallel replicas
STEPS, CLIP, LR = 3, 0.5, 0.01


def build(seed=0, aux=True):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2,
        output_router_logits=aux, router_aux_loss_coef=0.01, tie_word_embeddings=False))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # weights large enough to route unevenly
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


def batch(step, replica, data):
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(step))
    rows = ids[replica * ROWS // data:(replica + 1) * ROWS // data]
    return {"input_ids": rows, "labels": rows}


def config(ep, tp, stage):
    cfg = {"train_micro_batch_size_per_gpu": ROWS // (4 // tp), "gradient_accumulation_steps": 1,
           "gradient_clipping": CLIP, "steps_per_print": 1000, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
           "expert_parallel": {"enabled": True, "autoep_size": ep, "preset_model": "mixtral"}}
    if tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": tp, "preset_model": "mixtral"}
    return cfg


def reference(data=2):
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        total = 0.0
        for replica in range(data):
            loss = model(**batch(step, replica, data)).loss / data
            loss.backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}


def whole_weights(engine):
    """Every weight whole: the experts gathered over their expert-parallel group, tensor shards merged."""
    import dstp
    from dsmoe import autoep

    state = autoep.full_expert_state_dict(engine.module)
    tp = dstp.state_of(engine.module)
    out = {}
    for name, value in state.items():
        pp = tp.plan.params.get(name) if tp is not None else None
        if pp is not None and pp.sharded:
            shards = [torch.empty_like(value) for _ in range(tp.tp_size)]
            torch.distributed.all_gather(shards, value.contiguous(), group=tp.tensor_group.group)
            value = dstp.merge_shards(shards, pp)
        out[name] = value.detach().clone()
    return out


def train(engine, steps):
    groups = dscomm.groups.current()
    replica, data = groups.rank_in("data"), groups.size("data")
    losses, norms = [], []
    for step in steps:
        out = engine(**batch(step, replica, data))
        engine.backward(out.loss)
        engine.step()
        total = out.loss.detach().clone()
        torch.distributed.all_reduce(total, group=groups.data)
        losses.append(total.item() / data)
        norms.append(engine.get_global_grad_norm())
    return losses, norms


RUNS = [(2, 1), (2, 2), (1, 0)]  # (autoep_size, ZeRO stage): 2 = over the tensor ranks, 1 = every rank all experts


def runs(rank, world):
    results = []
    for ep, stage in RUNS:
        engine, *_ = dstrain.initialize(model=build(), config=config(ep, 2, stage))
        losses, norms = train(engine, range(STEPS))
        layer = engine.module.get_submodule("model.layers.0.mlp")
        cut = sum(1 for p in engine.module.parameters() if dscomm.is_tensor_parallel(p))
        results.append((losses, norms, whole_weights(engine), list(layer.local_experts.global_expert_ids()), cut))
    return results


def test_autoep_with_autotp_2_on_4_ranks_equals_one_process():
    want_losses, want_norms, want_weights = reference()
    for rank, per_run in enumerate(run_ranks(runs, 4, timeout=300)):
        tensor = rank % 2
        for (ep, stage), (losses, norms, weights, experts, cut) in zip(RUNS, per_run, strict=True):
            where = f"rank {rank}, autoep_size {ep}, ZeRO-{stage}"
            assert experts == ([2 * tensor, 2 * tensor + 1] if ep == 2 else [0, 1, 2, 3]), where
            assert cut == 8, where  # q, k, v, o of both layers: the experts and routers stay whole under AutoTP
            torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=0, msg=where)
            torch.testing.assert_close(norms, want_norms, rtol=1e-5, atol=0, msg=where)
            for name, value in weights.items():
                torch.testing.assert_close(value, want_weights[name], rtol=1e-4, atol=2e-5, msg=f"{where}: {name}")


# ---------------------------------------------------------------------------------------------- checkpoints
def saver(rank, world, root):
    engine, *_ = dstrain.initialize(model=build(aux=False), config=config(2, 2, 1))
    train(engine, range(2))
    engine.save_checkpoint(root / "ckpt", tag="t")
    engine.save_16bit_model(root / "hf", "pytorch_model.bin")
    probe = engine.module(**batch(99, 0, 1)).loss.item()
    train(engine, [2])
    return probe, whole_weights(engine)


def loader(rank, world, root, ep, tp, module_only):
    engine, *_ = dstrain.initialize(model=build(seed=5, aux=False), config=config(ep, tp, 1))
    engine.load_checkpoint(root / "ckpt", tag="t", load_module_only=module_only)
    probe = engine.module(**batch(99, 0, 1)).loss.item()
    if not module_only:
        train(engine, [2])  # the same global batch, split over this run's replicas
    return probe, whole_weights(engine), engine.global_steps


def test_a_checkpoint_reloads_at_the_same_layout_at_tensor_1_and_module_only(tmp_path):
    saved = run_ranks(saver, 4, tmp_path, timeout=300)
    probe, after = saved[0]
    for ep, tp, module_only in ((2, 2, False), (2, 1, False), (1, 2, True)):
        for loaded, weights, steps in run_ranks(loader, 4, tmp_path, ep, tp, module_only, timeout=300):
            where = f"autoep_size {ep}, autotp_size {tp}, module_only {module_only}"
            assert loaded == pytest.approx(probe, rel=1e-6), where
            if not module_only:  # the step after the load: the masters and Adam's moments of every expert came back
                assert steps == 3, where
                for name, value in weights.items():
                    torch.testing.assert_close(value, after[name], rtol=1e-5, atol=1e-6, msg=f"{where}: {name}")
    hf = build(seed=9, aux=False)
    hf.load_state_dict(torch.load(tmp_path / "hf" / "pytorch_model.bin", weights_only=True))  # strict
    assert hf(**batch(99, 0, 1)).loss.item() == pytest.approx(probe, rel=1e-6)
