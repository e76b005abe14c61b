"""Elastic training (the config's `elasticity` section): the engine takes its batch triple from the elastic
arithmetic at the running data-parallel size, so a job restarted at another size from its checkpoint keeps the same
global batch and continues as the uninterrupted run would; batch keys that disagree, a scheduler copy that differs
and replicas of another width are refused by name before anything is built."""

import json
import os

import pytest
import torch
from engine_models import ADAMW, TokenDataset, make_model

import dsconfig
import dstrain
from dscomm.testing import run_ranks
from dsconfig.elasticity import ElasticityConfigError, ElasticityError, ElasticityIncompatibleWorldSize
from dstrain.wiring.config_source import load_config

# Batch 8 divides among 1, 2 and 4 ranks: micro batch 4 x 2 steps at one rank, 4 x 1 at two, 2 x 1 at four.
ELASTIC = {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2, 4], "min_gpus": 1, "max_gpus": 4,
           "version": 0.1}


def elastic_config(**extra) -> dict:
    return {"elasticity": dict(ELASTIC), "gradient_clipping": 0.0, "steps_per_print": 10_000, "optimizer": ADAMW,
            "zero_optimization": {"stage": 2}, **extra}


def _weights(engine):
    return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def _step(engine, samples):
    """One optimizer step over this rank's share of `samples`, in micro batches of the engine's size."""
    share = len(samples) // engine.dp_world_size
    mine = samples[engine.global_rank * share:(engine.global_rank + 1) * share]
    micro = engine.train_micro_batch_size_per_gpu()
    for start in range(0, share, micro):
        engine.backward(engine(mine[start:start + micro]))
        engine.step()


def trained_at_two_ranks(rank, world, root):
    engine, *_ = dstrain.initialize(model=make_model(), config=elastic_config())
    batch = (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps())
    data = TokenDataset().data
    for step in range(2):
        _step(engine, data[8 * step:8 * step + 8])
    engine.save_checkpoint(root, tag="elastic")
    _step(engine, data[16:24])  # the uninterrupted next step
    return batch, engine.elasticity_enabled(), _weights(engine)


def resumed_at_one_rank(rank, world, root):
    engine, *_ = dstrain.initialize(model=make_model(seed=5), config=elastic_config())
    batch = (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps())
    engine.load_checkpoint(root, tag="elastic")
    _step(engine, TokenDataset().data[16:24])  # the same 8 samples, in two micro batches of 4
    return batch, engine.global_steps, _weights(engine)


def test_a_job_restarted_at_another_size_keeps_its_batch_and_continues(tmp_path):
    two = run_ranks(trained_at_two_ranks, 2, str(tmp_path), timeout=180)
    (batch_two, enabled, uninterrupted), (batch_two_rank1, _, _) = two
    assert batch_two == batch_two_rank1 == (8, 4, 1) and enabled
    batch_one, steps, resumed = run_ranks(resumed_at_one_rank, 1, str(tmp_path), timeout=180)[0]
    assert batch_one == (8, 4, 2) and steps == 3
    for name, weight in uninterrupted.items():  # same global batch, same Adam state: the same third step
        torch.testing.assert_close(resumed[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def refusals(rank, world):
    found = {}
    for name, config in (("batch key", elastic_config(train_batch_size=2)),
                         ("wider replicas", elastic_config(tensor_parallel={"autotp_size": 2})),
                         ("size not allowed", {**elastic_config(), "elasticity": dict(ELASTIC, max_gpus=1)})):
        try:
            dstrain.initialize(model=make_model(), config=config)
            found[name] = None
        except ElasticityError as exc:  # deepspeed.elasticity.config.ElasticityError under the alias
            found[name] = (type(exc).__name__, exc.paths, str(exc))
    os.environ["DEEPSPEED_ELASTICITY_CONFIG"] = json.dumps(dict(ELASTIC, max_train_batch_size=16))
    try:
        dstrain.initialize(model=make_model(), config=elastic_config())
        found["scheduler copy"] = None
    except ElasticityError as exc:
        found["scheduler copy"] = (type(exc).__name__, exc.paths, str(exc))
    finally:
        del os.environ["DEEPSPEED_ELASTICITY_CONFIG"]
    return found


def test_an_elastic_run_laid_out_otherwise_is_refused_by_name():
    found = run_ranks(refusals, 2, timeout=180)[0]
    kind, paths, text = found["batch key"]
    assert kind == ElasticityConfigError.__name__ and paths == ["train_batch_size"]
    assert "picks train_batch_size = 8 at data-parallel size 2" in text and "ignore_non_elastic_batch_info" in text
    kind, paths, text = found["wider replicas"]
    assert paths == ["elasticity.model_parallel_size"] and "this run's are 2" in text
    kind, paths, text = found["size not allowed"]
    assert kind == ElasticityIncompatibleWorldSize.__name__ and "valid sizes: [1]" in text
    kind, paths, text = found["scheduler copy"]
    assert paths == ["elasticity.max_train_batch_size"] and "DEEPSPEED_ELASTICITY_CONFIG (16)" in text


def test_ignored_batch_keys_are_replaced_and_a_loaded_config_picks_again_at_another_size():
    config = {**elastic_config(train_batch_size=2), "elasticity": dict(ELASTIC, ignore_non_elastic_batch_info=True)}
    with pytest.warns(dsconfig.ConfigWarning, match="train_batch_size = 2 -> 8"):
        cfg, _ = load_config(config, 2)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (8, 4, 1)
    again, _ = load_config(cfg, 4)  # a loaded config passed to initialize() at another size
    assert (again.train_batch_size, again.train_micro_batch_size_per_gpu, again.gradient_accumulation_steps) == \
        (8, 2, 1)
