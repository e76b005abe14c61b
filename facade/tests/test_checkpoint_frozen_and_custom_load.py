"""DeepSpeed's save_checkpoint / save_16bit_model(exclude_frozen_parameters=True) and
load_checkpoint(custom_load_fn=...): honoured at stage 0 and at stage 3, where the parameters live in
the ZeRO shards."""

from pathlib import Path

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dsaio
import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint.files import COMMON_FILE, MODEL_FILE
from dszero.checkpoint import write_manifest

STAGES = pytest.mark.parametrize("stage", [0, 3], ids=["stage0", "stage3"])
GATHER = {"stage3_gather_16bit_weights_on_model_save": True}


def _frozen_engine(stage, seed=0):
    model = make_model(seed)
    model.embed.weight.requires_grad_(False)  # a frozen base, as when fine-tuning an adapter
    cfg = config(stage=stage, optimizer=ADAMW, zero_optimization={"stage": stage, **GATHER,
                                                                  "stage3_param_persistence_threshold": 0})
    engine, *_ = dstrain.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                    config=cfg)
    return engine


def _steps(engine, n=2):
    data = TokenDataset().data
    for i in range(n):
        engine.backward(engine(data[i * 4:(i + 1) * 4]))
        engine.step()


def _weights(engine):
    with dstrain.zero.GatheredParameters(list(engine.module.parameters())):
        return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def save_and_reload(rank, world, directory, stage, exclude):
    engine = _frozen_engine(stage)
    _steps(engine)
    engine.save_checkpoint(directory, tag="t", exclude_frozen_parameters=exclude)
    engine.save_16bit_model(directory, "model16.safetensors", exclude_frozen_parameters=exclude)
    saved = _weights(engine)
    fresh = _frozen_engine(stage, seed=9)
    fresh_embed = fresh.module.embed.weight.detach().clone()
    fresh.load_checkpoint(directory, tag="t")  # strict: the excluded frozen keys are not reported missing
    loaded = _weights(fresh)
    trained_same = all(torch.equal(saved[n], loaded[n]) for n in saved if n != "embed.weight")
    return trained_same, torch.equal(loaded["embed.weight"], saved["embed.weight"]), \
        torch.equal(loaded["embed.weight"], fresh_embed)


@STAGES
def test_exclude_frozen_parameters_leaves_them_out_of_both_files(tmp_path, stage):
    results = run_ranks(save_and_reload, 2, str(tmp_path / "out"), stage, True, timeout=120)
    for trained_same, frozen_from_checkpoint, frozen_kept in results:
        assert trained_same and frozen_kept and not frozen_from_checkpoint
    assert "embed.weight" not in dsaio.load_state_dict(tmp_path / "out" / "t" / MODEL_FILE)
    sixteen = dsaio.load(tmp_path / "out" / "model16.safetensors")
    assert "embed.weight" not in sixteen and "head.weight" in sixteen


@STAGES
def test_frozen_parameters_are_saved_by_default(tmp_path, stage):
    # At stage 3 the trained parameters live in the ZeRO shards; the frozen ones are only in the module file.
    results = run_ranks(save_and_reload, 2, str(tmp_path / "in"), stage, False, timeout=120)
    for trained_same, frozen_from_checkpoint, _ in results:
        assert trained_same and frozen_from_checkpoint
    assert "embed.weight" in dsaio.load_state_dict(tmp_path / "in" / "t" / MODEL_FILE)
    assert "embed.weight" in dsaio.load(tmp_path / "in" / "model16.safetensors")


def _engine(stage, seed=0):
    engine, *_ = dstrain.initialize(model=make_model(seed), config=config(stage=stage, optimizer=ADAMW))
    return engine


CALLS = []


def renaming_load(src, dst):
    """Loads a checkpoint whose head is to be reset, as a user's function would: by the keys of `src`."""
    CALLS.append(sorted(src))
    state = {k: v for k, v in src.items() if not k.startswith("head.")}
    dst.load_state_dict(state, strict=False)
    with torch.no_grad():
        dst.head.bias.fill_(7.0)


def custom_load(rank, world, directory, stage, module_only):
    engine = _engine(stage)
    _steps(engine, 3)
    engine.save_checkpoint(directory, tag="t")
    saved = _weights(engine)
    fresh = _engine(stage, seed=4)
    CALLS.clear()
    fresh.load_checkpoint(directory, tag="t", load_module_only=module_only, custom_load_fn=renaming_load)
    loaded = _weights(fresh)
    keys = CALLS[0]
    head_bias = loaded["head.bias"].clone()
    body_same = all(torch.equal(saved[n], loaded[n]) for n in saved if not n.startswith("head."))
    _steps(fresh, 1)  # the next update starts from what the function loaded: the masters took it
    moved = (_weights(fresh)["head.bias"] - head_bias).abs().max().item()
    return keys, head_bias.unique().tolist(), body_same, moved, torch.equal(loaded["head.bias"], saved["head.bias"])


@STAGES
def test_custom_load_fn_replaces_the_module_load(tmp_path, stage):
    expected_keys = sorted(name for name, _ in make_model().named_parameters())
    for keys, bias, body_same, moved, _ in run_ranks(custom_load, 2, str(tmp_path), stage, True, timeout=120):
        assert keys == expected_keys  # src holds the whole module state, also at stage 3
        assert bias == [7.0] and body_same and moved < 0.1


def test_custom_load_fn_in_a_full_load_is_followed_by_the_zero_masters(tmp_path):
    # As in DeepSpeed: the function loads the module, then the optimizer's master weights are restored.
    for keys, _, body_same, _, head_restored in run_ranks(custom_load, 2, str(tmp_path), 3, False, timeout=120):
        assert keys and body_same and head_restored


def not_callable(rank, world, directory):
    engine = _engine(0)
    engine.save_checkpoint(directory, tag="t")
    try:
        engine.load_checkpoint(directory, tag="t", custom_load_fn="load_it")
    except TypeError as exc:
        return str(exc)
    return ""


def test_a_custom_load_fn_that_is_not_callable_is_refused(tmp_path):
    message = run_ranks(not_callable, 1, str(tmp_path))[0]
    assert "custom_load_fn" in message and "str" in message


def crafted_exclusion(rank, world, directory):
    engine = _frozen_engine(0)
    engine.save_checkpoint(directory, tag="t", exclude_frozen_parameters=True)
    common_file = Path(directory) / "t" / COMMON_FILE
    common = dsaio.load_state_dict(common_file)
    common["excluded_frozen"] = {"embed.weight": 1}  # not a list of names
    dsaio.save_state_dict(common, common_file)
    write_manifest(Path(directory) / "t")  # a consistent manifest: the content itself is checked
    try:
        _frozen_engine(0).load_checkpoint(directory, tag="t")
    except dstrain.CheckpointLoadError as exc:
        return str(exc)
    return ""


def test_a_crafted_exclusion_list_is_refused(tmp_path):
    message = run_ranks(crafted_exclusion, 1, str(tmp_path))[0]
    assert "excluded_frozen" in message and "dict" in message
