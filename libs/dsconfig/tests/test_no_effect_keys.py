"""Keys dstrain reads nowhere are named: a tuning knob with nothing to tune (or set where it acts only at
another stage) warns, a value asking for something dstrain does not do is refused by path."""

import warnings

import pytest

import dsconfig

NO_EFFECT = [
    ({"zero_optimization": {"allgather_partitions": False}}, "zero_optimization.allgather_partitions"),
    ({"zero_optimization": {"allgather_bucket_size": 2e8}}, "zero_optimization.allgather_bucket_size"),
    ({"zero_optimization": {"reduce_scatter": False}}, "zero_optimization.reduce_scatter"),
    ({"zero_optimization": {"contiguous_gradients": False}}, "zero_optimization.contiguous_gradients"),
    ({"zero_optimization": {"compute_grad_norm": False}}, "zero_optimization.compute_grad_norm"),
    ({"zero_optimization": {"round_robin_gradients": True}}, "zero_optimization.round_robin_gradients"),
    ({"zero_optimization": {"stage": 3, "stage3_module_granularity_threshold": 100}},
     "zero_optimization.stage3_module_granularity_threshold"),
    ({"zero_optimization": {"stage": 3, "overlap_comm": True}}, "zero_optimization.overlap_comm"),
    ({"zero_optimization": {"stage": 1, "reduce_bucket_size": 1e6}}, "zero_optimization.reduce_bucket_size"),
    ({"zero_optimization": {"stage": 3, "sub_group_size": 1e6}}, "zero_optimization.sub_group_size"),
    ({"zero_optimization": {"stage": 3, "save_muon_momentum_buffer_in_memory": True}},
     "zero_optimization.save_muon_momentum_buffer_in_memory"),
    ({"zero_optimization": {"stage": 1, "ignore_unused_parameters": False}}, "zero_optimization.ignore_unused_parameters"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "fast_init": True}}},
     "zero_optimization.offload_optimizer.fast_init"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "pipeline_read": True}}},
     "zero_optimization.offload_optimizer.pipeline_read"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "pipeline_write": True}}},
     "zero_optimization.offload_optimizer.pipeline_write"),
    ({"checkpoint": {"parallel_write": {"pipeline_stage": True}}}, "checkpoint.parallel_write.pipeline_stage"),
    ({"torch_autocast": {"enabled": True}}, "torch_autocast.lower_precision_safe_modules"),
    ({"compile": {"offload_activation": True}}, "compile.offload_activation"),
    ({"compile": {"offload_activation_pin_memory": False}}, "compile.offload_activation_pin_memory"),
    ({"compile": {"free_activation": True}}, "compile.free_activation"),
    ({"compile": {"free_activation_threshold": 1}}, "compile.free_activation_threshold"),
    ({"compile": {"double_buffer": False}}, "compile.double_buffer"),
    ({"compile": {"sync_after_allgather": True}}, "compile.sync_after_allgather"),
    ({"compile": {"keep_all_input_tensors": True}}, "compile.keep_all_input_tensors"),
    ({"pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2}}, "pipeline.pipe_partitioned"),
    ({"pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2}}, "pipeline.grad_partitioned"),
    ({"pipeline": {"use_reentrant": False}}, "pipeline.use_reentrant"),
]


def _warnings(raw, strict):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dsconfig.load(raw, strict=strict)
    return " ".join(str(w.message) for w in caught if issubclass(w.category, dsconfig.ConfigWarning))


@pytest.mark.parametrize(("raw", "path"), NO_EFFECT, ids=[p for _, p in NO_EFFECT])
def test_a_key_with_no_effect_warns_by_name_even_when_strict(raw, path):
    assert f"{path} = " in _warnings(raw, strict=True)


@pytest.mark.parametrize("raw", [
    {"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 1e6}},  # stage 2 uses both
    {"zero_optimization": {"stage": 3, "sub_group_size": 1e6, "offload_optimizer": {"device": "nvme"}}},
    {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "allgather_bucket_size": 5e8}},  # auto, default
    {"zero_optimization": {"stage": 2, "ignore_unused_parameters": False}},
])
def test_where_the_key_acts_it_is_not_warned(raw):
    assert _warnings(raw, strict=True) == ""


REQUESTS = [
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}},
     "zero_optimization.offload_optimizer.ratio"),
    ({"zero_optimization": {"parameter_alignment": True}}, "zero_optimization.parameter_alignment"),
    ({"aio": {"use_gds": True}}, "aio.use_gds"),
]


@pytest.mark.parametrize(("raw", "path"), REQUESTS, ids=[p for _, p in REQUESTS])
def test_a_value_asking_for_what_dstrain_lacks_is_refused_by_path(raw, path):
    assert [p.path for p in dsconfig.requested_unsupported(raw)] == [path]
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(raw, strict=True)
    assert path in info.value.paths
    assert path in _warnings(raw, strict=False)


def test_default_values_ask_for_nothing():
    raw = {"zero_optimization": {"parameter_alignment": False, "offload_optimizer": {"device": "cpu", "ratio": 1}},
           "aio": {"use_gds": False}}
    assert dsconfig.requested_unsupported(raw) == []
