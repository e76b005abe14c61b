import importlib.metadata

import pytest
import torch

import dscompile
from dscompile.profiling import InputStore
from dsconfig import CompileConfig


def test_version_matches_the_installed_metadata():
    assert dscompile.__version__ == importlib.metadata.version("dscompile")


def test_public_api_is_listed_and_the_error_is_a_value_error():
    for name in dscompile.__all__:
        assert hasattr(dscompile, name), name
    assert issubclass(dscompile.DeepCompileError, ValueError)


def test_the_feature_entry_point_names_deepcompile():
    points = importlib.metadata.entry_points(group="dstrain.features")
    assert any(p.name == "compile.deepcompile" and p.value == "dscompile" for p in points)


def test_every_pass_is_registered_under_the_references_name():
    assert set(dscompile.PASSES) == {"zero1_compile", "zero2_compile", "zero3_compile", "prefetch",
                                     "selective_gather", "free_activation", "offload_activation",
                                     "offload_adam_states", "offload_parameters", "long_context_checkpointing"}


@pytest.mark.parametrize(("keep_int", "keep_all", "kept"), [(True, False, "ints"), (False, False, "none"),
                                                            (False, True, "all")])
def test_the_profiling_run_keeps_the_input_values_the_keys_ask_for(keep_int, keep_all, kept):
    settings = CompileConfig(deepcompile=True, keep_int_input_tensors=keep_int, keep_all_input_tensors=keep_all)
    store = InputStore(keep_int=settings.keep_int_input_tensors, keep_all=settings.keep_all_input_tensors)
    tokens, activations = torch.arange(6).reshape(2, 3), torch.randn(2, 3)
    weight = torch.nn.Parameter(torch.randn(3))
    store.record(0, [tokens, activations, weight])
    tokens.add_(100)  # later calls change their inputs; the store holds the recorded values
    got_tokens, got_activations, got_weight = store.inputs(0)
    assert got_weight is weight  # parameters are held, never copied
    assert got_tokens.shape == (2, 3) and got_activations.shape == (2, 3)
    assert torch.equal(got_tokens, torch.arange(6).reshape(2, 3) if kept in ("ints",) else
                       tokens if kept == "all" else torch.zeros(2, 3, dtype=torch.long))
    assert torch.equal(got_activations, activations) == (kept == "all")
    assert store.inputs(1) is None
