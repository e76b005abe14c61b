"""`deepspeed.runtime.zero.unwrap_model_for_generation` (DeepSpeed's runtime/zero/test_unwrap_model.py, as TRL
uses it): inside the block a ZeRO-3 engine's weights are whole and stage 3's gathering hooks are off, so
forwards need no collective; after it the hooks are back and training goes on, at stage 3 equal to a run that
never entered the block. Below stage 3 it changes nothing."""

import importlib

import pytest
import torch
from engine_models import ADAMW, config, make_model

import dstrain
from dscomm.testing import run_ranks

SEQ, VOCAB = 12, 48


def batch(step, rank):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (4, SEQ + 1), generator=gen)


def hooks_on(engine):
    module_hooks = any(m._forward_pre_hooks or m._forward_hooks for m in engine.module.modules())
    # DeepSpeed's own test counts the optimizer's handle lists (its parameter_offload's names)
    assert bool(engine.optimizer.forward_hooks) == bool(engine.optimizer.backward_hooks) == module_hooks
    return module_hooks


def train(rank, world, stage, unwrap):
    importlib.import_module("dstrain.as_deepspeed")  # forked rank: the alias stays in this process
    from deepspeed.runtime.zero import unwrap_model_for_generation
    from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation as from_stage3

    assert from_stage3 is unwrap_model_for_generation
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, model_parameters=model.parameters(),
                                    config=config(stage=stage, optimizer=ADAMW))
    seen = {}
    losses = []
    for step in range(3):
        loss = engine(batch(step, rank))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if unwrap and step == 0:
            seen["hooks_before"] = hooks_on(engine)
            with unwrap_model_for_generation(engine) as unwrapped:
                seen["yields_engine"] = unwrapped is engine
                seen["hooks_inside"] = hooks_on(engine)
                seen["whole"] = all(tuple(p.shape) == tuple(getattr(p, "ds_shape", p.shape)) and p.numel() > 0
                                    for p in model.parameters())
                seen["head_shape"] = tuple(model.head.weight.shape)
                with torch.no_grad():
                    seen["forward"] = model(batch(99, 0)).item()  # the same tokens on every rank
            seen["hooks_after"] = hooks_on(engine)
    return losses, seen


@pytest.mark.parametrize("stage", [3, 2])
def test_weights_are_whole_and_hooks_off_inside_and_training_goes_on_after(stage):
    plain = run_ranks(train, 2, stage, False)
    unwrapped = run_ranks(train, 2, stage, True)
    for (losses, seen), (expected, _) in zip(unwrapped, plain, strict=True):
        assert losses == pytest.approx(expected, rel=1e-6)
        assert seen["yields_engine"] and seen["whole"] and seen["head_shape"] == (VOCAB, 24)
        assert not seen["hooks_inside"]
        assert seen["hooks_before"] == seen["hooks_after"] == (stage == 3)
    assert unwrapped[0][1]["forward"] == pytest.approx(unwrapped[1][1]["forward"], rel=1e-6)
