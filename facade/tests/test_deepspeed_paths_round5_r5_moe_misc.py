"""DeepSpeed names its own unit tests use (issue 35, round 5: MoE, ZeRO's exception, groups, the flops profiler, the
accelerator classes, the version names), resolved under the alias and used. One subprocess: the alias is
process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import io, os, re, sys, contextlib
import deepspeed, torch
import deepspeed.comm as dist
import deepspeed.moe.sharded_moe as sharded_moe
import deepspeed.utils.groups as groups
from deepspeed.moe.sharded_moe import top1gating, top2gating, topkgating, _route_slots, _sparse_encode, _sparse_decode
from deepspeed.runtime.zero.utils import ZeRORuntimeException
from deepspeed.accelerator import get_accelerator, set_accelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator
import dszero.errors

# version names (runtime/test_ds_config_dict.py::test_check_version)
assert (deepspeed.__version_major__, deepspeed.__version_minor__, deepspeed.__version_patch__) == tuple(
    int(p) for p in deepspeed.__version__.split(".")[:3])
assert deepspeed.__git_hash__ == "[none]" and deepspeed.__git_branch__ == "[none]"

# the accelerator classes under DeepSpeed's names (AutoEP's test helpers pick the CPU by hand)
set_accelerator(CPU_Accelerator())
assert get_accelerator().device_name() == "cpu" and CUDA_Accelerator.__name__ == "CudaAccelerator"

# initialize without a model: a TypeError, and the AssertionError DeepSpeed's assert raises
for call in (lambda: deepspeed.initialize(model=None, config={"train_batch_size": 1}),
             lambda: deepspeed.initialize(torch.nn.Linear(2, 2), config={"train_batch_size": 1})):
    try:
        call()
        raise SystemExit("initialize without model= was accepted")
    except AssertionError as exc:
        assert isinstance(exc, TypeError) and "needs model=" in str(exc), exc

# DeepSpeedConfig._configure_train_batch_size: the triple settled from what a script set, at the data-parallel size
from deepspeed.runtime.config import DeepSpeedConfig
config = DeepSpeedConfig({"train_batch_size": 4})
config.world_size = 2
config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps = 32, None, 2
config._configure_train_batch_size()
assert (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) == (32, 8, 2)
for triple in ((33, 17, 2), (None, None, 2)):
    config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps = triple
    try:
        config._configure_train_batch_size()
        raise SystemExit(f"batch triple {triple} accepted")
    except AssertionError as exc:
        assert isinstance(exc, ValueError) and "train_batch_size" in str(exc), exc

# AutoEP's layer under DeepSpeed's name; the rest of module_inject (inference injection) is named as not provided
from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
import deepspeed.module_inject
import dsmoe.autoep
assert AutoEPMoELayer is dsmoe.autoep.AutoEPLayer
try:
    deepspeed.module_inject.replace_transformer_layer
    raise SystemExit("module_inject.replace_transformer_layer resolved")
except AttributeError as exc:
    assert "does not provide it" in str(exc), exc

# ZeRO's exception is dszero's error: an except around ZeRO catches dstrain's
assert ZeRORuntimeException is dszero.errors.ZeroError

# sparse routes: k rows of S, a dropped route's expert -1; the gather dispatch equals the dense one
torch.manual_seed(0)
logits, hidden = torch.randn(16, 4), torch.randn(16, 8)
for dense, sparse, k in ((top1gating(logits, 0.5, 0, use_rts=False), top1gating(logits, 0.5, 0, use_rts=False,
                                                                              sparse_routes=True), 1),
                         (top2gating(logits, 0.5, 0, top2_2nd_expert_sampling=False),
                          top2gating(logits, 0.5, 0, top2_2nd_expert_sampling=False, sparse_routes=True), 2),
                         (topkgating(logits, 3, 0.5, 0), topkgating(logits, 3, 0.5, 0, sparse_routes=True), 3)):
    capacity, experts, slots, gates = int(sparse[1]), sparse[3], sparse[4], sparse[5]
    assert experts.shape == (k, 16) and sparse[2] == 4
    places = _route_slots(experts, slots, 4, capacity)
    expected = torch.einsum("sec,sm->ecm", dense[2].float(), hidden)
    torch.testing.assert_close(_sparse_encode(hidden, places, 4, capacity), expected)
    out = torch.randn_like(expected)
    torch.testing.assert_close(_sparse_decode(out.view(-1, 8), places, gates, 16),
                               torch.einsum("sec,ecm->sm", dense[1], out))
assert sharded_moe.TUTEL_INSTALLED is False and sharded_moe.dist is dist

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
deepspeed.init_distributed(dist_backend="gloo")
# ep_group: no collective for a group of one (or None); drop_tokens=False sizes the capacity by the busiest expert
calls = []
original = sharded_moe.dist.all_reduce
sharded_moe.dist.all_reduce = lambda *a, **kw: calls.append(kw) or original(*a, **kw)
_, _, dispatch, counts = top1gating(torch.randn(8, 4), 1, 0, drop_tokens=False, ep_group=dist.new_group([0]))
assert calls == [] and dispatch.shape[2] == int(counts.max())
sharded_moe.dist.all_reduce = original

groups._create_expert_and_data_parallel(1)
assert groups.get_expert_parallel_world_size(1) == 1 and groups._get_expert_model_parallel_world_size() == 1

# engine.flops_profiler: the printed totals stay after the profiled step
model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 1))
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "flops_profiler": {"enabled": True, "profile_step": 1, "detailed": False}})
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    for _ in range(2):
        engine.backward(engine(torch.ones(1, 10)).sum())
        engine.step()
assert engine.flops_profiler.params == 121 and engine.flops_profiler.flops == 2 * (100 + 10), (
    engine.flops_profiler.params, engine.flops_profiler.flops)
assert re.search(r"data parallel size:\s+1", printed.getvalue()), printed.getvalue()
print("ok")
"""


def test_round5_moe_misc_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
