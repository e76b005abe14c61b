"""initialize(): where the config comes from, how the batch triple is completed, and what is refused."""

import argparse
import copy
import json

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks


def _init(rank, world, **kwargs):
    engine, optimizer, loader, scheduler = dstrain.initialize(model=make_model(), **kwargs)
    return (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
            type(optimizer).__name__, loader is None, scheduler is None)


def _error(rank, world, **kwargs):
    try:
        dstrain.initialize(model=make_model(), **kwargs)
    except Exception as exc:  # the message is what the test reads
        return type(exc).__name__, str(exc)
    return None, ""


def test_config_from_a_path_a_dict_config_params_and_args(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config(optimizer=ADAMW)))
    args = dstrain.add_config_arguments(argparse.ArgumentParser()).parse_args(
        ["--deepspeed", "--deepspeed_config", str(path)])
    expected = (4, 4, 1, "ZeroOptimizer", True, True)
    assert run_ranks(_init, 1, config=str(path))[0] == expected
    assert run_ranks(_init, 1, config_params=config(optimizer=ADAMW))[0] == expected
    assert run_ranks(_init, 1, args=args)[0] == expected


def test_two_config_sources_are_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config()))
    args = argparse.Namespace(deepspeed_config=str(path))
    name, message = run_ranks(_error, 1, args=args, config=config())[0]
    assert name == "ConfigError" and "--deepspeed_config" in message


def test_no_config_and_a_missing_file_say_what_to_pass(tmp_path):
    assert "deepspeed_config" in run_ranks(_error, 1)[0][1]
    assert "file not found" in run_ranks(_error, 1, config=str(tmp_path / "nope.json"))[0][1]


def test_batch_triple_is_completed_from_the_world_size():
    cfg = {"train_batch_size": 16, "gradient_accumulation_steps": 2, "optimizer": ADAMW}
    assert [r[:3] for r in run_ranks(_init, 2, config=cfg)] == [(16, 4, 2)] * 2


def test_an_undeterminable_or_inconsistent_batch_triple_is_refused():
    name, message = run_ranks(_error, 2, config={"train_batch_size": 15, "train_micro_batch_size_per_gpu": 4})[0]
    assert name == "ConfigError" and "train_batch_size" in message


def test_auto_placeholders_are_refused_by_path():
    cfg = config(optimizer={"type": "AdamW", "params": {"lr": "auto"}})
    name, message = run_ranks(_error, 1, config=cfg)[0]
    assert name == "ConfigError" and "optimizer.params.lr" in message and "auto" in message


@pytest.mark.parametrize(("extra", "path"), [
    ({"sparse_attention": {"mode": "fixed"}}, "sparse_attention"),
    ({"dynamic_train": {"random_ltd": {"enabled": True}}}, "dynamic_train"),  # data_efficiency: dsdata composes it
    ({"progressive_layer_drop": {"enabled": True}}, "progressive_layer_drop"),
])
def test_features_no_library_provides_fail_naming_the_key(extra, path):
    name, message = run_ranks(_error, 1, config=config(**extra))[0]
    assert name == "UnsupportedFeatureError" and path in message


def test_a_turned_off_unsupported_feature_is_accepted():
    result = run_ranks(_init, 1, config=config(optimizer=ADAMW, progressive_layer_drop={"enabled": False}))[0]
    assert result[0] == 4


def _loader_shards(rank, world):
    _, _, loader, _ = dstrain.initialize(model=make_model(), training_data=TokenDataset(size=32),
                                         config=config(micro=4, optimizer=ADAMW))
    return torch.cat(list(loader)).tolist()


def test_training_data_is_split_over_ranks_in_micro_batches():
    a, b = run_ranks(_loader_shards, 2)
    assert len(a) == len(b) == 16
    assert sorted(map(tuple, a + b)) == sorted(map(tuple, TokenDataset(size=32).data.tolist()))


def _engine_surface(rank, world):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer=ADAMW))
    engine.eval()
    assert not model.training
    engine.train()
    surface = (engine.zero_optimization_stage(), engine.get_lr(), engine.get_mom(), engine.module is model,
               engine.embed is model.embed, engine.is_gradient_accumulation_boundary(),
               engine.sparse_tensor_module_names)
    # backward returns the loss as its gradients count (DeepSpeed's): divided by the accumulation steps.
    accumulating, *_ = dstrain.initialize(model=make_model(), config=config(gas=4, optimizer=ADAMW))
    tokens = torch.randint(0, 48, (4, 13), generator=torch.Generator().manual_seed(0))
    loss = accumulating(tokens)
    returned = [accumulating.backward(loss, retain_graph=True).item(),
                accumulating.backward(loss, scale_wrt_gas=False).item()]
    # torch.func.grad through the engine differentiates the module as it is: no accumulation scaling.
    bare = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    functional, *_ = dstrain.initialize(model=copy.deepcopy(bare), config=config(gas=4, optimizer=ADAMW))
    x = torch.randn(4, generator=torch.Generator().manual_seed(1))
    same_grad = torch.allclose(torch.func.grad(lambda v: functional(v).sum())(x),
                               torch.func.grad(lambda v: bare(v).sum())(x), atol=1e-6)
    return surface, returned, loss.item(), same_grad


def test_engine_accessors_and_what_backward_returns():
    surface, returned, loss, same_grad = run_ranks(_engine_surface, 1)[0]
    assert same_grad
    assert surface == (0, [0.01], [(0.9, 0.999)], True, True, True, set())
    assert returned == pytest.approx([loss / 4, loss], rel=1e-6)


def _compiled_step(rank, world):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config=config(optimizer=ADAMW, compile={"backend": "eager"}))
    engine.compile(backend="eager")
    before = model.head.bias.detach().clone()
    engine.backward(engine(TokenDataset().data[:4]))
    engine.step()
    return engine.is_compiled, not torch.equal(before, model.head.bias)


def test_engine_compile_and_old_compile_options_are_accepted():
    assert run_ranks(_compiled_step, 1)[0] == (True, True)
