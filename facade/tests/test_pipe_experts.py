"""MoE layers inside dspipe's PipelineModule, with expert groups per stage: dsmoe's MoE layer (ep_size 2, ZeRO-1)
and AutoEP's swap of Hugging Face Mixtral blocks (autoep_size 2, ZeRO-2) in a 2-stage pipeline on 4 gloo ranks
(pipe 2 x data 2: each stage's experts split over its 2 data ranks) train as one process does (losses, clipped
gradient norms, weights); a checkpoint reloads at the same layout, at one stage (the experts by global id, Adam's
moments with them) and at expert-parallel size 1."""

import pytest
import torch
from three_d_models import MICRO, UNITS, DecoderLayer, MoEBlock, batches, pipe_name, pipeline, reference

import dscomm
import dstrain
from dscomm.testing import run_ranks
from dstrain.pipe import LayerSpec

pytest.importorskip("transformers")

STEPS, CLIP, LR = 3, 0.5, 0.02
AUTOEP = {"enabled": True, "autoep_size": 2, "preset_model": "mixtral", "moe_layer_pattern": r"\d+\.layer\.mlp"}


def dsmoe_body(ep_size, ep_rank):
    return lambda index: LayerSpec(MoEBlock, index, ep_size, ep_rank)


def mixtral_body(index):
    return LayerSpec(DecoderLayer, index, "mixtral")


def config(stage, data, kind, ep=2):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": UNITS // data,
           "steps_per_print": 10_000, "gradient_clipping": CLIP,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage}}
    if kind == "autoep":
        cfg["expert_parallel"] = {**AUTOEP, "autoep_size": ep}
    return cfg


def engine_at(kind, stages, data, stage, ep=2):
    rank = torch.distributed.get_rank()
    if kind == "dsmoe":  # the layer builds its experts by global id: it must know its expert-parallel rank
        ep_rank = dscomm.ParallelDims(stages * data, pipe=stages).coords(rank).data % ep
        body = dsmoe_body(ep, ep_rank)
    else:
        body = mixtral_body
    module = pipeline(stages, 1, data, body=body)
    engine, *_ = dstrain.initialize(model=module, config=config(stage, data, kind, ep))
    return engine


def train(engine, steps):
    replica, data = engine.groups.rank_in("data"), engine.groups.size("data")
    losses, norms = [], []
    for step in steps:
        losses.append(engine.train_batch(batches(step, replica, data)).item())
        norms.append(engine.get_global_grad_norm())
    return losses, norms


def expert_slices(engine):
    """(first expert, count) of this rank's AutoEP experts, by stacked weight name."""
    from dsmoe import autoep

    out = {}
    for name, layer in autoep.autoep_layers(engine.module):
        for key in autoep.stacked_expert_weights(name, layer):
            out[pipe_name(key)] = (layer.local_experts.first_expert, layer.local_experts.num_local)
    return out


def pipelined(rank, world):
    results = {}
    for kind, stage in (("dsmoe", 1), ("autoep", 2)):
        engine = engine_at(kind, 2, 2, stage)
        losses, norms = train(engine, range(STEPS))
        weights = {pipe_name(n): p.detach().clone() for n, p in engine.module.named_parameters()}
        results[kind] = losses, norms, weights, expert_slices(engine)
    return results


def test_a_2_stage_pipeline_holding_moe_layers_equals_one_process():
    want = {"dsmoe": reference(STEPS, CLIP, LR, body=dsmoe_body(1, 0)),
            "autoep": reference(STEPS, CLIP, LR, body=mixtral_body)}
    experts_seen = {"dsmoe": set(), "autoep": set()}
    for rank, results in enumerate(run_ranks(pipelined, 4, timeout=300)):
        for kind, (losses, norms, weights, slices) in results.items():
            want_losses, want_norms, want_weights = want[kind]
            where = f"rank {rank}, {kind}"
            torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=0, msg=where)
            torch.testing.assert_close(norms, want_norms, rtol=1e-5, atol=0, msg=where)
            for name, value in weights.items():
                expected = want_weights[name]
                if name in slices:  # this rank's experts of an AutoEP stacked weight
                    first, count = slices[name]
                    expected = expected[first:first + count]
                    experts_seen[kind] |= {(name, e) for e in range(first, first + count)}
                elif "deepspeed_experts." in name:
                    experts_seen[kind].add(name)
                # AutoEP routes in float32: Adam turns its rounding in a near-zero gradient into a visible step
                atol = 2e-4 if kind == "autoep" else 1e-8
                torch.testing.assert_close(value, expected, rtol=1e-4, atol=atol,
                                           msg=lambda m, w=where, n=name: f"{w}: {n}: {m}")
    assert len(experts_seen["dsmoe"]) == 2 * 4 * 4  # 2 layers x 4 experts x 4 tensors, each on some rank
    assert len(experts_seen["autoep"]) == 2 * 2 * 4  # 2 layers x 2 stacked weights x 4 experts


# ---------------------------------------------------------------------------------------------- checkpoints
KINDS = ("dsmoe", "autoep")


def saver(rank, world, root):
    """pipe 2 x data 2, expert-parallel size 2, ZeRO-1: two steps, a save, two steps more."""
    continued = {}
    for kind in KINDS:
        engine = engine_at(kind, 2, 2, 1)
        train(engine, range(2))
        engine.save_checkpoint(root / kind)
        continued[kind] = train(engine, range(2, 4))[0]
    return continued, sorted(p.name for p in (root / "dsmoe" / "global_step2").iterdir() if "expert" in p.name)


def loader(rank, world, root, stages, ep):
    continued = {}
    for kind in KINDS:
        engine = engine_at(kind, stages, world // stages, 2, ep)  # ZeRO-2 now
        engine.load_checkpoint(root / kind)
        continued[kind] = train(engine, range(2, 4))[0]
    return continued


def test_a_pipeline_checkpoint_with_experts_reloads_at_the_same_layout_at_one_stage_and_ep_size_1(tmp_path):
    saved = run_ranks(saver, 4, tmp_path, timeout=300)
    want, files = saved[0]
    # each stage's experts in files of their own, numbered by MoE layer over the whole pipeline
    assert files == sorted(f"layer_{layer}_expert_{expert}_mp_rank_00_model_states.safetensors"
                           for layer in range(2) for expert in range(4)), files
    for stages, ep in ((2, 2), (1, 2), (2, 1)):
        for rank, continued in enumerate(run_ranks(loader, 4, tmp_path, stages, ep, timeout=300)):
            for kind in KINDS:  # the masters and moments came back with the experts: the steps after the save
                torch.testing.assert_close(continued[kind], want[kind], rtol=1e-6, atol=0,
                                           msg=f"rank {rank}, {kind}, {stages} stage(s), expert-parallel size {ep}")
