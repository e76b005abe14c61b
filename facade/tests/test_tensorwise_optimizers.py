"""Lamb and Muon (whole-tensor updates) through the engine, at ZeRO stages 0-3, equal the same optimizer on
the bare model (Muon's parameters chosen by DeepSpeed's rule), and their state survives a checkpoint
exactly; a per-tensor optimizer without a sharded step is refused by key at a partitioning stage."""

import pytest
import torch
from engine_models import TokenDataset, config, make_model

import dstrain
import dszero
from dscomm.testing import run_ranks
from dstrain.ops import Lamb, Muon
from dstrain.ops.muon_params import select_muon_parameters

OPTIMIZERS = {
    "Lamb": ({"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01}}, lambda p: Lamb(p, lr=1e-2,
                                                                                           weight_decay=0.01)),
    "Muon": ({"type": "Muon", "params": {"lr": 1e-2, "momentum": 0.9}}, lambda p: Muon(p, lr=1e-2, momentum=0.9)),
    "Adafactor": ({"type": "Adafactor", "params": {"lr": 1e-2}}, None),
}
STEPS = 4


def engine_run(rank, world, name, stage=0):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config=config(stage=stage, optimizer=OPTIMIZERS[name][0]))
    data = TokenDataset().data
    losses = []
    for i in range(STEPS):
        loss = engine(data[i * 4:(i + 1) * 4])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with dszero.GatheredParameters(list(model.parameters())):  # stage 3 holds shards only
        return losses, [p.detach().clone() for p in model.parameters()]


def bare_run(rank, world, name):
    model = make_model()
    if name == "Muon":
        select_muon_parameters(model)  # what the engine does for optimizer.type Muon: the embedding takes Adam
    optimizer = OPTIMIZERS[name][1](model.parameters())
    data = TokenDataset().data
    losses = []
    for i in range(STEPS):
        loss = model(data[i * 4:(i + 1) * 4])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def engine_stages(rank, world, name):
    return [engine_run(rank, world, name, stage) for stage in range(4)]


@pytest.mark.parametrize("name", ["Lamb", "Muon"])
def test_engine_at_every_stage_equals_the_bare_optimizer(name):
    # Both ranks train on the same batches, so their mean gradient is the bare model's.
    per_stage = run_ranks(engine_stages, 2, name, timeout=180)[0]
    (expected,) = run_ranks(bare_run, 1, name)
    for got in per_stage:
        torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(expected[0]), rtol=1e-5, atol=1e-6)
        for a, b in zip(got[1], expected[1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def resume_run(rank, world, name, directory, resume):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(optimizer=OPTIMIZERS[name][0]))
    data = TokenDataset().data
    if resume:
        engine.load_checkpoint(directory)
    else:
        for i in range(3):
            engine.backward(engine(data[i * 4:(i + 1) * 4]))
            engine.step()
        engine.save_checkpoint(directory)
    losses = []
    for i in range(3, 6):
        loss = engine(data[i * 4:(i + 1) * 4])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", ["Lamb", "Muon"])
def test_state_survives_a_checkpoint_exactly(tmp_path, name):
    original = run_ranks(resume_run, 2, name, str(tmp_path), False)
    resumed = run_ranks(resume_run, 2, name, str(tmp_path), True)
    assert resumed == original


def test_a_per_tensor_optimizer_without_a_sharded_step_is_refused_by_key_at_a_partitioning_stage():
    def attempt(rank, world):
        try:
            engine_run(rank, world, "Adafactor", stage=1)
        except dstrain.ConfigError as exc:
            return str(exc)
        return ""

    message = run_ranks(attempt, 1)[0]
    assert "zero_optimization.stage" in message and "Adafactor" in message
