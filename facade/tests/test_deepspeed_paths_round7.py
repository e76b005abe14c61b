"""DeepSpeed names its own unit tests use (issue 35, round 7), resolved under the alias and used:
runtime/test_runtime_utils.py's gradient helpers of `deepspeed.runtime.utils` (`clip_grad_norm_` averaging the norm
over data-parallel ranks whose expert gradients differ, `CheckOverflow` seeing an expert's inf on another rank,
`get_weight_norm`'s -1 for a non-finite norm, `call_to_str`, `count_used_parameters_in_backward`), at two gloo
ranks forked by dscomm.testing.run_ranks inside one subprocess (the alias is process-wide); v1/half_precision/test_mixed_precision_dtype.py's
engine steps under DeepSpeed's private names; v1/zero/test_zero_init_pg_contradiction.py's zero.Init check."""

from alias_snippet import run_alias_snippet

RUNTIME_UTILS = r"""
import dstrain.as_deepspeed
import math
import torch
import deepspeed.runtime.utils as ds_utils
import deepspeed.utils.groups as groups
from dscomm.testing import run_ranks


def params(expert_grad):
    shared = torch.nn.Parameter(torch.zeros(1))
    shared.grad = torch.tensor([1.0])
    expert = torch.nn.Parameter(torch.zeros(1))
    expert.grad = torch.tensor([expert_grad])
    expert.allreduce = False  # a MoE expert's parameter: its gradient differs between the data-parallel ranks
    return [shared, expert]


def rank_main(rank, world):
    groups._create_expert_and_data_parallel(2)

    # clip_grad_norm_: each rank's norm differs (its expert's gradient); both clip by their mean
    clipped = params(float(rank + 1))
    norm = ds_utils.clip_grad_norm_(clipped, max_norm=0.1)
    expected = (math.sqrt(2.0) + math.sqrt(5.0)) / 2
    assert abs(float(norm) - expected) < 1e-5, (rank, float(norm), expected)
    coef = 0.1 / (expected + 1e-6)
    assert abs(float(clipped[1].grad) - (rank + 1) * coef) < 1e-6
    # the same gradients on every rank: torch's own clip_grad_norm_, bit for bit
    ours, torchs = params(1.0), params(1.0)
    ds_utils.clip_grad_norm_(ours, max_norm=0.1)
    torch.nn.utils.clip_grad_norm_(torchs, 0.1)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, torchs))
    under = params(0.0)
    ds_utils.clip_grad_norm_(under, max_norm=10.0)
    assert float(under[0].grad) == 1.0  # under the limit: untouched

    # CheckOverflow: an inf in rank 1's expert is an overflow on both ranks, by gradients and by norms
    checked = params(float("inf") if rank == 1 else 1.0)
    assert ds_utils.CheckOverflow([checked]).check() is True
    norm = ds_utils.get_weight_norm([torch.cat([p.grad for p in checked])])
    assert (norm == -1) == (rank == 1)
    assert ds_utils.CheckOverflow([checked]).check_using_norm([norm], reduce_overflow=False) is True
    assert ds_utils.CheckOverflow([params(1.0)]).check() is False
    assert ds_utils.CheckOverflow([params(1.0)]).check_using_norm([1.5]) is False


if __name__ == "__main__":
    assert ds_utils.call_to_str("int") == "int()"
    assert ds_utils.call_to_str("int", 3, "jeff") == "int(3, 'jeff')"
    assert ds_utils.call_to_str("hello", 1138, val=3) == "hello(1138, val=3)"
    assert abs(ds_utils.get_global_norm([3.0, 4.0]) - 5.0) < 1e-12

    # count_used_parameters_in_backward: inside a backward, the parameters whose gradients it will produce
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    seen = {}

    def count_in_hook(grad):
        seen["count"] = ds_utils.count_used_parameters_in_backward([used, unused, used])

    used.register_hook(count_in_hook)
    (used * 2.0).sum().backward()
    assert seen["count"] == 1, seen
    try:
        ds_utils.count_used_parameters_in_backward([used])
    except RuntimeError as exc:
        assert "during a backward pass" in str(exc)
    else:
        raise AssertionError("count_used_parameters_in_backward outside a backward pass did not raise")

    run_ranks(rank_main, 2, timeout=120)  # dscomm's forked gloo ranks: a failed assertion fails here, named
    print("ok")
"""


def test_runtime_utils_gradient_helpers_under_the_alias_at_two_ranks(tmp_path):
    run_alias_snippet(RUNTIME_UTILS, tmp_path)


MIXED_PRECISION_STEPS = r"""
import dstrain.as_deepspeed
import types
import pytest, torch
from deepspeed.runtime.engine import DeepSpeedEngine


def stand_in(param_dtype=None, buffer_dtype=None, fp16=False, bf16=False):
    config = types.SimpleNamespace(param_dtype=param_dtype, buffer_dtype=buffer_dtype)
    return types.SimpleNamespace(_config=config, fp16_enabled=lambda: fp16, bfloat16_enabled=lambda: bf16)


def module_with_rotary_buffer():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4))
    module.register_buffer("inv_freq", torch.ones(4))
    return module


assert DeepSpeedEngine._mixed_precision_dtypes(stand_in(bf16=True)) == (torch.bfloat16, None)
assert DeepSpeedEngine._mixed_precision_dtypes(stand_in(fp16=True)) == (torch.float16, None)
assert DeepSpeedEngine._mixed_precision_dtypes(stand_in()) == (None, None)
assert DeepSpeedEngine._mixed_precision_dtypes(stand_in(buffer_dtype="fp32", bf16=True)) == (torch.bfloat16,
                                                                                              torch.float32)
DeepSpeedEngine._assert_valid_mixed_precision_config(stand_in(bf16=True))
DeepSpeedEngine._assert_valid_mixed_precision_config(stand_in(param_dtype="bf16", bf16=True))
DeepSpeedEngine._assert_valid_mixed_precision_config(stand_in(param_dtype="fp32"))
for param_dtype, fp16, bf16 in (("fp16", False, True), ("fp32", False, True), ("bf16", True, False),
                                ("bf16", False, False)):
    with pytest.raises(AssertionError, match="data_types.param_dtype="):
        DeepSpeedEngine._assert_valid_mixed_precision_config(stand_in(param_dtype, fp16=fp16, bf16=bf16))

module = module_with_rotary_buffer()
DeepSpeedEngine._cast_module_mixed_precision(types.SimpleNamespace(module=module), torch.bfloat16, None, False)
assert {p.dtype for p in module.parameters()} == {torch.bfloat16} and module.inv_freq.dtype == torch.float32
module = module_with_rotary_buffer()
DeepSpeedEngine._cast_module_mixed_precision(types.SimpleNamespace(module=module), torch.bfloat16, None, True)
assert {p.dtype for p in module.parameters()} == {torch.float32}  # a zero.Init model keeps what it was built in
DeepSpeedEngine._cast_module_mixed_precision(types.SimpleNamespace(module=module), None, torch.bfloat16, False)
assert {p.dtype for p in module.parameters()} == {torch.float32} and module.inv_freq.dtype == torch.bfloat16

# v1/zero/test_zero_init_pg_contradiction.py: zero.Init's check for a one-rank group under a multi-process launcher
from deepspeed.runtime.zero.partition_parameters import _contradicting_single_rank_pg_error

assert "WORLD_SIZE=8" in _contradicting_single_rank_pg_error(dp_world_size=1, explicit_process_group=None,
                                                             env={"WORLD_SIZE": "8"})
assert _contradicting_single_rank_pg_error(dp_world_size=8, explicit_process_group=None, env={"WORLD_SIZE": "8"}) is None
print("ok")
"""


def test_the_engines_mixed_precision_steps_under_deepspeeds_private_names(tmp_path):
    run_alias_snippet(MIXED_PRECISION_STEPS, tmp_path)
