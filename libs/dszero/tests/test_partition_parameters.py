"""DeepSpeed's `partition_parameters` names on dszero: ZeroParamStatus / ds_id / ds_status on partitioned
parameters, Init's training dtype and tensor-constructor overrides from a config (and a caller's replacement
of the wrapper, as Hugging Face Transformers makes), and ZeroInference (stage 3 without an optimizer)."""

import pytest
import torch
from models import make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig
from dszero import partition_parameters as pp
from dszero.partition_parameters import ZeroParamStatus


def statuses(rank, world):
    with dszero.Init():
        model = make_model()
    weight = model.head.weight
    before = (weight.ds_status, weight.numel())
    with dszero.GatheredParameters([weight]):
        during = (weight.ds_status, weight.numel())
    after = weight.ds_status
    ids = [p.ds_id for p in model.parameters()]
    optimizer = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     ZeroConfig(stage=3, stage3_param_persistence_threshold=100))
    kept = [p.ds_id for p in model.parameters()]
    # Units (a module's parameters) under the persistence threshold stay gathered.
    small = [p.ds_status for p in model.parameters() if p._dszero_unit.persistent]
    large = [p.ds_status for p in model.parameters() if not p._dszero_unit.persistent]
    del optimizer
    return before, during, after, ids, kept, small, large


def test_partitioned_parameters_carry_deepspeeds_ds_id_and_a_live_ds_status():
    for before, during, after, ids, kept, small, large in run_ranks(statuses, 2, timeout=60):
        assert before == (ZeroParamStatus.NOT_AVAILABLE, 0)
        assert during == (ZeroParamStatus.AVAILABLE, 64 * 32)
        assert after == ZeroParamStatus.NOT_AVAILABLE
        assert len(set(ids)) == len(ids) and kept == ids  # unique, and kept when stage 3 takes the units over
        assert small and set(small) == {ZeroParamStatus.AVAILABLE}  # persistent units stay gathered
        assert large and set(large) == {ZeroParamStatus.NOT_AVAILABLE}


def dtypes_under_a_config(rank, world, config):
    with dszero.Init(config_dict_or_path=config):
        made = {"zeros": torch.zeros(2).dtype, "double": torch.ones(2, dtype=torch.float64).dtype,
                "arange": torch.arange(3.0).dtype, "ints": torch.arange(3).dtype, "randn": torch.randn(2).dtype}
        layer = torch.nn.Linear(4, 4)
    made["parameter"] = layer.weight.dtype
    made["after"] = torch.zeros(2).dtype
    return made


def test_init_builds_in_the_configs_training_dtype_as_deepspeed():
    # Only Init's sections are read: an incomplete batch triple or Hugging Face's "auto" is not its business.
    bf16 = {"bf16": {"enabled": True}, "train_batch_size": 7, "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}
    made = run_ranks(dtypes_under_a_config, 2, bf16, timeout=60)[0]
    assert made == {"zeros": torch.bfloat16, "double": torch.bfloat16, "arange": torch.bfloat16,
                    "ints": torch.int64, "randn": torch.bfloat16, "parameter": torch.bfloat16,
                    "after": torch.float32}
    fp32 = run_ranks(dtypes_under_a_config, 1, {"zero_optimization": {"stage": 3}}, timeout=60)[0]
    assert fp32["double"] == torch.float32 and fp32["parameter"] == torch.float32  # DeepSpeed casts to fp32 too


def both_half_precisions(rank, world):
    with pytest.raises(ValueError, match="fp16 and bf16 cannot both be enabled"):
        dszero.Init(config_dict_or_path={"bf16": {"enabled": True}, "fp16": {"enabled": True}})
    return True


def test_a_config_with_both_half_precisions_is_refused():
    assert run_ranks(both_half_precisions, 1, timeout=60) == [True]


def arange_kept(rank, world):
    """What transformers' prevent_arange_dtype_change does: replace the wrapper for the length of an Init."""
    original = pp.zero_wrapper_for_fp_tensor_constructor

    def keep_arange(fn, target_fp_dtype, target_device=None):
        return fn if fn is pp._orig_torch_arange else original(fn, target_fp_dtype, target_device)

    pp.zero_wrapper_for_fp_tensor_constructor = keep_arange
    try:
        with dszero.Init(dtype=torch.float16):
            made = (torch.arange(3.0).dtype, torch.zeros(1).dtype)
    finally:
        pp.zero_wrapper_for_fp_tensor_constructor = original
    return made, torch.arange is pp._orig_torch_arange


def test_a_replaced_constructor_wrapper_is_used_for_that_init():
    assert run_ranks(arange_kept, 1, timeout=60)[0] == ((torch.float32, torch.float16), True)


def inference(rank, world, built_under_init, cast):
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    whole = make_model().double() if cast else make_model()
    with torch.no_grad():
        expected = whole(tokens)
    if built_under_init:
        with dszero.Init():
            model = make_model()
    else:
        model = make_model()
    if cast:
        model.double()  # an engine casting the module after Init (bf16 / fp16 in practice)
    dszero.ZeroInference(model, ZeroConfig(stage=3, stage3_param_persistence_threshold=40))
    with torch.no_grad():
        got = model(tokens)
        got_again = model(tokens)
    held = sum(p.numel() for p in model.parameters())
    small_held = all(p.numel() == p.ds_numel for p in model.parameters() if p.ds_numel < 40)
    return torch.equal(got, expected), torch.equal(got_again, expected), held, small_held, got.dtype


@pytest.mark.parametrize("built_under_init, cast", [(True, False), (False, False), (True, True)])
def test_zero_inference_gathers_each_module_around_its_forward(built_under_init, cast):
    for equal, equal_again, held, small_held, dtype in run_ranks(inference, 2, built_under_init, cast, timeout=60):
        assert equal and equal_again
        assert small_held and held < 2000  # only the persistent small units are whole between forwards
        assert dtype == (torch.float64 if cast else torch.float32)
