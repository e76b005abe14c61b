"""Exact resume: 10 steps, save, 10 more; a fresh set of processes that loads the checkpoint and trains
10 steps gives bit-identical losses (data position, RNG for dropout, scheduler, fp16 scaler included)."""

import pytest
import torch
from engine_models import TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks

SCHEDULER = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 5,
                                                 "total_num_steps": 40}}


def _train(engine, loader, steps):
    losses = []
    for _ in range(steps * engine.gradient_accumulation_steps()):
        loss = engine(next(loader))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def run(rank, world, stage, directory, resume, extra):
    torch.manual_seed(100 + rank)  # dropout differs per rank, as in real runs
    model = make_model(dropout=0.2)
    cfg = config(micro=4, gas=2, stage=stage, optimizer={"type": "AdamW", "params": {"lr": 1e-2}},
                 scheduler=SCHEDULER, **extra)
    engine, _, loader, _ = dstrain.initialize(model=model, training_data=TokenDataset(size=96), config=cfg)
    batches = dstrain.RepeatingLoader(loader)
    if resume:
        _path, client = engine.load_checkpoint(directory)
        assert client == {"note": "mid-run", "step": 10}
        batches = dstrain.RepeatingLoader(loader)  # the loader resumes where the saved run was
        return _train(engine, batches, 10), engine.global_steps, engine.get_lr()
    first = _train(engine, batches, 10)
    engine.save_checkpoint(directory, client_state={"note": "mid-run", "step": 10})
    second = _train(engine, batches, 10)
    return second, engine.global_steps, engine.get_lr(), first


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_resume_is_bit_identical_at_every_stage(tmp_path, stage):
    original = run_ranks(run, 2, stage, str(tmp_path), False, {}, timeout=120)
    resumed = run_ranks(run, 2, stage, str(tmp_path), True, {}, timeout=120)
    for rank in range(2):
        assert resumed[rank][0] == original[rank][0]  # exact, not approximately
        assert resumed[rank][1:3] == original[rank][1:3] == (20, original[rank][2])


def test_resume_restores_the_fp16_loss_scale(tmp_path):
    extra = {"fp16": {"enabled": True, "initial_scale_power": 40, "loss_scale_window": 3}}  # overflows first
    original = run_ranks(run, 1, 1, str(tmp_path), False, extra, timeout=120)
    resumed = run_ranks(run, 1, 1, str(tmp_path), True, extra, timeout=120)
    assert resumed[0][0] == original[0][0]
