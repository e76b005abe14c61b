"""`load_section`: one section read as `load` reads it inside a whole config, without the cross-section rules."""

import warnings

import pytest

import dsconfig


def test_a_section_alone_migrates_old_keys_and_checks_bounds():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        zero = dsconfig.load_section("zero_optimization", {"cpu_offload_param": True, "prefetch_bucket_size": 7})
    assert zero.offload_param is not None and zero.offload_param.device == "cpu"
    assert zero.stage3_prefetch_bucket_size == 7 and zero.stage == 0  # offload at stage 0: no cross-section rule
    assert any("cpu_offload_param" in str(w.message) for w in seen)
    assert dsconfig.load_section("tensorboard", None) == dsconfig.TensorBoardConfig()
    with pytest.raises(dsconfig.ConfigError, match=r"zero_optimization\.stage3_max_live_parameters"):
        dsconfig.load_section("zero_optimization", {"stage3_max_live_parameters": -1})


@pytest.mark.parametrize("name", ["nope", "train_batch_size", "optimizer_missing"])
def test_a_name_that_is_not_a_section_is_refused_by_name(name):
    with pytest.raises(dsconfig.ConfigError, match=name):
        dsconfig.load_section(name, {})
