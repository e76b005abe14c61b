"""random-LTD in the engine: convert_to_random_ltd on the engine (DeepSpeed's way) or on the model before
initialize(), the reserved length stepping with the optimizer steps, its state in checkpoints, and the
refusals (pipeline parallelism, random_ltd_initialize without the config)."""

import warnings

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model
from test_data_efficiency import LTD

import dscomm
import dsconfig
import dsdata
import dstrain
from dscomm.testing import run_ranks
from dstrain.wiring.compose import Composed
from dstrain.wiring.dsdata import apply_random_ltd

ROUTING = {"enabled": True, "data_routing": {"enabled": True, "random_ltd": LTD}}


def _steps(engine, data, count):
    for i in range(count):
        loss = engine(data[2 * i:2 * i + 2])
        engine.backward(loss)
        engine.step()


def _engine_and_checkpoint(rank, world, checkpoints):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(micro=2, optimizer=ADAMW,
                                                                        data_efficiency=ROUTING))
    dstrain.convert_to_random_ltd(engine, torch.nn.Sequential)  # DeepSpeed's call, on the engine
    layers = dsdata.random_ltd_layers(engine.module)
    configured = [layer.random_ltd_scheduler is not None for layer in layers]
    data = TokenDataset().data
    seen = []
    layers[1].register_forward_hook(lambda module, args, out: seen.append(module.reserved_length))
    _steps(engine, data, 3)
    engine.save_checkpoint(checkpoints, tag="three")
    state = engine.random_ltd_scheduler.state_dict()
    _steps(engine, data, 2)

    model = make_model()
    dstrain.convert_to_random_ltd(model, torch.nn.Sequential)  # on the model, before initialize()
    fresh, *_ = dstrain.initialize(model=model, config=config(micro=2, optimizer=ADAMW, data_efficiency=ROUTING))
    fresh.load_checkpoint(checkpoints, tag="three")
    restored = fresh.random_ltd_scheduler.state_dict()
    return configured, seen, state, restored


def test_reserved_length_steps_with_training_and_is_checkpointed(tmp_path):
    configured, seen, state, restored = run_ranks(_engine_and_checkpoint, 1, str(tmp_path), timeout=120)[0]
    assert configured == [False, True]  # random_ltd_layer_id [1]: the second Sequential only
    assert seen == [4, 4, 8, 8, 12]  # the schedule's value at steps 0..4 (4 + 2 * step, multiples of 4)
    assert state == restored and state["consumed_layer_tokens"] == 2 * (4 + 12) * 2 + 2 * (8 + 12)


def _pipeline(rank, world):
    groups = dscomm.ParallelDims(world_size=2, pipe=2).build()
    cfg = dsconfig.load(config(micro=2, data_efficiency=ROUTING), world_size=1)
    model = make_model()
    try:
        apply_random_ltd(Composed(model, list(model.parameters())), cfg, groups)
    except dstrain.DstrainError as exc:
        return str(exc)
    return ""


def test_refused_under_pipeline_parallelism():
    message = run_ranks(_pipeline, 2, timeout=120)[0]
    assert "data_efficiency.data_routing.random_ltd.enabled" in message and "pipeline" in message


def _unconverted(rank, world):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(micro=2, optimizer=ADAMW,
                                                                        data_efficiency=ROUTING))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(engine, TokenDataset().data, 2)
    plain, *_ = dstrain.initialize(model=make_model(), config=config(micro=2, optimizer=ADAMW))
    with pytest.raises(dstrain.DstrainError, match="random-LTD is off"):
        dstrain.convert_to_random_ltd(plain, torch.nn.Sequential)
    return [str(w.message) for w in caught]


def test_enabled_without_converted_layers_warns_once_and_conversion_needs_the_config():
    messages = run_ranks(_unconverted, 1, timeout=120)[0]
    assert sum("convert_to_random_ltd" in m for m in messages) == 1
