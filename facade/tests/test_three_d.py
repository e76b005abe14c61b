"""3D parallelism as Megatron-DeepSpeed runs it: a PipelineModule of Hugging Face Llama layers, cut by AutoTP inside
each stage, data-parallel with ZeRO-1 or -2 beside it, on 8 gloo ranks as pipe 2 x tensor 2 x data 2, the embedding
tied to the LM head across the first and last stage. It trains as one process does (losses, clipped gradient norms,
weights), an overflow on one rank skips the step on all, and a checkpoint reloads at pipe 2 x tensor 1 x data 4 and
the reverse, continuing as the uninterrupted run."""

import pytest
import torch
from three_d_models import MICRO, UNITS, batches, pipe_name, pipeline, reference

import dscomm
import dstrain
from dscomm.testing import run_ranks

pytest.importorskip("transformers")

WORLD, STEPS, CLIP, LR = 8, 3, 0.5, 0.02


def config(stage, tp, data):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": UNITS // data,
           "steps_per_print": 10_000, "gradient_clipping": CLIP,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, **({"reduce_bucket_size": 200} if stage == 2 else {})}}
    if tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": tp, "preset_model": "llama"}
    return cfg


def engine_at(tp, stage):
    data = WORLD // (2 * tp)
    module = pipeline(2, tp, data)
    engine, *_ = dstrain.initialize(model=module, config=config(stage, tp, data))
    return engine


def train(engine, steps):
    replica, data = engine.groups.rank_in("data"), engine.groups.size("data")
    return [engine.train_batch(batches(step, replica, data)).item() for step in steps]


def stage_weights(engine):
    """This rank's stage's weights, each whole (merged over the tensor ranks), by the plain module's names."""
    from tp_models import whole_parameters

    return {pipe_name(name): value for name, value in whole_parameters(engine).items()}


# ---------------------------------------------------------------------------------------------- training
def three_d(rank, world):
    results = {}
    for stage in (1, 2):
        engine = engine_at(2, stage)
        losses, norms = [], []
        for step in range(STEPS):
            losses += train(engine, [step])
            norms.append(engine.get_global_grad_norm())
        sharded = sum(1 for p in engine.module.parameters() if dscomm.is_tensor_parallel(p))
        results[stage] = losses, norms, stage_weights(engine), sharded
    return results


def test_pipe2_x_tensor2_x_data2_with_zero_1_and_2_equals_one_process():
    want_losses, want_norms, want_weights = reference(STEPS, CLIP, LR)
    seen = set()
    for rank, results in enumerate(run_ranks(three_d, WORLD, timeout=420)):
        for stage, (losses, norms, weights, sharded) in results.items():
            where = f"rank {rank}, ZeRO-{stage}"
            assert sharded == 7, where  # both stages hold a decoder layer cut by AutoTP
            torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=0, msg=where)
            # clipped at 0.5: the norm is every stage's and every shard's, each counted once
            torch.testing.assert_close(norms, want_norms, rtol=1e-5, atol=0, msg=where)
            for name, value in weights.items():
                torch.testing.assert_close(value, want_weights[name], rtol=1e-5, atol=1e-8, msg=f"{where}: {name}")
            seen |= set(weights)
    assert seen == set(want_weights)  # every weight of the model was held by some stage


def overflow(rank, world):
    from three_d_models import specs, token_loss

    from dstrain.pipe import PipelineModule

    try:  # built without the tensor axis (num_stages alone): refused by key, naming the topology to pass
        dstrain.initialize(model=PipelineModule(specs(), num_stages=2, loss_fn=token_loss), config=config(1, 2, 2))
        refused = ""
    except dstrain.UnsupportedFeatureError as exc:
        refused = str(exc)
    try:  # the pipeline's loss is its loss_fn's: no model loss_function to slice the logits for
        cfg = config(1, 2, 2)
        cfg["tensor_parallel"]["vocab_parallel_lm_head"] = True
        dstrain.initialize(model=pipeline(2, 2, 2), config=cfg)
    except dstrain.UnsupportedFeatureError as exc:
        refused += str(exc)
    engine = engine_at(2, 2)
    train(engine, [0])
    coords = engine.groups.dims.coords(rank)
    if (coords.pipe, coords.tensor, coords.data) == (1, 1, 0):  # one rank of the last stage, one shard, one replica
        param = next(p for p in engine.module.parameters() if dscomm.is_tensor_parallel(p))
        param.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    before = stage_weights(engine)
    train(engine, [1])
    after = stage_weights(engine)
    unchanged = all(torch.equal(before[name], after[name]) for name in before)
    return engine.skipped_steps, engine.get_global_grad_norm(), unchanged, refused


def test_an_overflow_on_one_rank_skips_the_step_on_every_stage_shard_and_replica():
    for rank, (skipped, norm, unchanged, refused) in enumerate(run_ranks(overflow, WORLD, timeout=300)):
        assert skipped == 1 and norm == float("inf") and unchanged, rank
        assert "tensor_parallel.autotp_size" in refused and "num_mp=2" in refused, refused
        assert "tensor_parallel.vocab_parallel_lm_head" in refused, refused


# ---------------------------------------------------------------------------------------------- checkpoints
def first_run(rank, world, root):
    """pipe 2 x tensor 2 x data 2, ZeRO-1: two steps, a save, then four steps more (the uninterrupted run)."""
    engine = engine_at(2, 1)
    train(engine, range(2))
    engine.save_checkpoint(root / "tp2")
    return train(engine, range(2, 6))


def narrower(rank, world, root):
    """pipe 2 x tensor 1 x data 4, ZeRO-2: the tensor-parallel checkpoint, merged by its plan; its own save after."""
    engine = engine_at(1, 2)
    engine.load_checkpoint(root / "tp2")
    losses = train(engine, range(2, 4))
    engine.save_checkpoint(root / "tp1")
    return losses + train(engine, range(4, 6)), engine.global_steps


def wider(rank, world, root):
    """Back at pipe 2 x tensor 2 x data 2: the tensor-1 checkpoint, cut by this run's plan."""
    engine = engine_at(2, 1)
    engine.load_checkpoint(root / "tp1")
    return train(engine, range(4, 6)), engine.global_steps


def test_a_3d_checkpoint_reloads_at_tensor_1_x_data_4_and_back(tmp_path):
    uninterrupted = run_ranks(first_run, WORLD, tmp_path, timeout=300)[0]
    saved = sorted(p.name for p in (tmp_path / "tp2" / "global_step2").iterdir() if p.name.startswith("layer_"))
    # DeepSpeed's names: one file per layer and tensor rank, written by data rank 0 of each
    assert saved == [f"layer_{layer:02d}-model_{tp:02d}-model_states.safetensors" for layer in range(5)
                     for tp in range(2)], saved
    for losses, steps in run_ranks(narrower, WORLD, tmp_path, timeout=300):
        # the masters and Adam's moments came back merged: the next steps are the uninterrupted run's
        torch.testing.assert_close(losses, uninterrupted, rtol=1e-6, atol=0)
        assert steps == 6
    for losses, steps in run_ranks(wider, WORLD, tmp_path, timeout=300):
        torch.testing.assert_close(losses, uninterrupted[2:], rtol=1e-6, atol=0)
        assert steps == 6
