"""What Hugging Face Transformers, Accelerate and DeepSpeed-Chat call on DeepSpeed, provided by the facade
(their own runs are in deepspeed-compat/tests, where the `deepspeed` distribution is announced): the engine's
consolidated 16-bit state dict, a stage-3 engine without an optimizer, Accelerate's config dict, and the
DeepSpeed module paths they import."""

import json
import subprocess
import sys

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks
from dstrain.compat.checkpoint.utils import clone_tensors_for_torch_save
from dstrain.compat.compression.helper import recursive_getattr, recursive_setattr


def _consolidated(rank, world, stage, gather):
    model = make_model()
    model.head.weight = model.embed.weight  # tied, as language models tie their embeddings
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = config(stage=stage, optimizer=ADAMW)
    cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = gather
    engine, *_ = dstrain.initialize(model=model, config=cfg)
    if stage != 3:
        with pytest.raises(ValueError, match="needs ZeRO stage 3"):
            engine._zero3_consolidated_16bit_state_dict()
        return engine.zero_gather_16bit_weights_on_model_save()
    state = engine._zero3_consolidated_16bit_state_dict()
    held = sum(p.numel() for p in engine.module.parameters())
    if state is None:
        return None, held
    same = state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in expected)
    return same, state["head.weight"] is state["embed.weight"], held


def test_the_consolidated_16bit_state_dict_gathers_zero3_weights_on_rank_0():
    first, second = run_ranks(_consolidated, 2, 3, True, timeout=120)
    assert first == (True, True, 0)  # whole on rank 0, tied names one tensor; the engine stays partitioned
    assert second == (None, 0)
    assert run_ranks(_consolidated, 1, 2, False, timeout=120) == [False]


def _without_optimizer(rank, world):
    tokens = TokenDataset()[0].unsqueeze(0)
    with torch.no_grad():
        expected = make_model()(tokens)
    engine, optimizer, *_ = dstrain.initialize(model=make_model(), config=config(stage=3))
    with torch.no_grad():
        got = engine(tokens)
    return optimizer is None, torch.equal(got, expected), sum(p.numel() for p in engine.module.parameters())


def test_a_zero3_engine_without_an_optimizer_keeps_its_parameters_partitioned_and_evaluates():
    # DeepSpeed-Chat's reference and reward models: initialize() with a stage-3 config and no optimizer.
    for no_optimizer, equal, held in run_ranks(_without_optimizer, 2, timeout=120):
        assert no_optimizer and equal and held == 0


def _accelerates_dict(rank, world):
    cfg = config(optimizer=ADAMW, stage=3)
    cfg["steps_per_print"] = float("inf")  # what Accelerate's DeepSpeedPlugin writes
    cfg["zero_optimization"].update(offload_param={"device": "none", "nvme_path": None},
                                    offload_optimizer={"device": "none", "nvme_path": None})
    engine, *_ = dstrain.initialize(model=make_model(), config=cfg)
    return engine.steps_per_print() > 10**15


def test_accelerates_config_dict_is_read_as_deepspeed_reads_it():
    assert run_ranks(_accelerates_dict, 1, timeout=120) == [True]


def test_recursive_getattr_and_setattr_reach_layers_by_dotted_name():
    model = make_model()
    assert recursive_getattr(model, "layers.1.4") is model.layers[1][4]
    replacement = torch.nn.Linear(48, 24)
    recursive_setattr(model, "layers.1.4", replacement)
    assert model.layers[1][4] is replacement
    with pytest.raises(AttributeError, match=r"'layers.7.4'.*has no attribute '7'"):
        recursive_getattr(model, "layers.7.4")


def test_tensors_cloned_for_torch_save_own_just_their_elements():
    flat = torch.arange(10.0)
    state = {"a": flat[2:4], "nested": [flat[:1], (flat[5:],)], "n": 3}
    cloned = clone_tensors_for_torch_save(state)
    assert cloned["n"] == 3 and torch.equal(cloned["a"], flat[2:4])
    for tensor in (cloned["a"], cloned["nested"][0], cloned["nested"][1][0]):
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


SNIPPET = """
import dstrain.as_deepspeed
import deepspeed
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus, zero_wrapper_for_fp_tensor_constructor
from deepspeed.runtime.zero import partition_parameters
from deepspeed.compression.helper import recursive_getattr, recursive_setattr
from deepspeed.checkpoint.utils import clone_tensors_for_torch_save
from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME
assert DEEPSPEED_ENVIRONMENT_NAME == ".deepspeed_env"
assert deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES[0] == "LRRangeTest"  # attribute chains, as Accelerate reads
assert deepspeed.runtime.zero.partition_parameters.ZeroParamStatus is ZeroParamStatus
try:
    deepspeed.runtime.sequence_parallel
except AttributeError as exc:
    print(exc)
"""


def test_the_deepspeed_paths_integrations_import_resolve_and_a_missing_one_says_so():
    run = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "deepspeed.runtime.sequence_parallel: dstrain" in run.stdout and "does not provide it" in run.stdout


OPS_SNIPPET = """
import dstrain.as_deepspeed
import deepspeed, torch, sys
from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder, InferenceBuilder
from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.lion import DeepSpeedCPULion
from deepspeed.utils import set_z3_leaf_modules
from deepspeed.utils.torch import required_torch_version
from deepspeed.runtime.pipe import LayerSpec, PipelineModule, ProcessTopology, TiedLayerSpec
from deepspeed.moe.sharded_moe import top1gating
assert deepspeed.ops.__compatible_ops__[AsyncIOBuilder.NAME] and deepspeed.ops.__compatible_ops__[CPUAdamBuilder.NAME]
assert not InferenceBuilder().is_compatible()
try:
    InferenceBuilder().load()
except ImportError as exc:
    print(exc)
handle = AsyncIOBuilder().load().aio_handle()
data = torch.arange(4096, dtype=torch.float32)
handle.async_pwrite(data, sys.argv[1])
assert handle.wait() == 1
back = torch.empty_like(data)
handle.sync_pread(back, sys.argv[1])
assert torch.equal(back, data)
assert required_torch_version(min_version=2.1) and not required_torch_version(max_version="1.13")
from deepspeed import get_accelerator
accelerator = get_accelerator()
assert accelerator.ByteTensor([1, 2]).dtype == torch.uint8 and accelerator.BFloat16Tensor([1.0]).dtype == torch.bfloat16
plain = torch.ones(3)
assert accelerator.unpin_memory(plain) is None and not accelerator.is_pinned(plain)
from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
from deepspeed.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd
from deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer
curriculum = CurriculumScheduler({"curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
                                  "schedule_type": "fixed_linear",
                                  "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}})
assert [curriculum.update_difficulty(step) for step in (1, 5, 10, 20)] == [8, 32, 64, 64]
from deepspeed.git_version_info import installed_ops, torch_info, version
assert version == deepspeed.__version__ and installed_ops["cpu_adam"] and not installed_ops["transformer_inference"]
assert torch_info["version"] == ".".join(torch.__version__.split(".")[:2])
assert torch_info["cuda_version"] == ".".join((torch.version.cuda or "0.0").split(".")[:2])
print("ok")
"""


def test_deepspeeds_op_builders_load_dstrains_ops_and_name_what_is_not_there(tmp_path):
    run = subprocess.run([sys.executable, "-c", OPS_SNIPPET, str(tmp_path / "t.bin")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "InferenceBuilder (transformer_inference) cannot be loaded: dstrain does not implement DeepSpeed's " \
           "inference kernels" in run.stdout
    assert run.stdout.rstrip().endswith("ok")


def _optimizer_kinds(rank, world):
    import dstrain.as_deepspeed  # the alias first: `deepspeed` is dstrain from here on

    # isort: split
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    kinds = (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3, FP16_Optimizer, BF16_Optimizer)
    found = {}
    for name, extra in (("stage 2", {"zero_optimization": {"stage": 2}}), ("stage 3", {}),
                        ("stage 0 bf16", {"bf16": {"enabled": True}})):
        stage = 3 if name == "stage 3" else (2 if name == "stage 2" else 0)
        cfg = config(stage=stage, optimizer=ADAMW, **extra)
        engine, *_ = dstrain.initialize(model=make_model(), config=cfg)
        masters = {"stage 2": "single_partition_of_fp32_groups", "stage 3": "fp32_partitioned_groups_flat",
                   "stage 0 bf16": "fp32_groups_flat"}[name]
        partitions = getattr(engine.optimizer, masters)
        found[name] = ([k.__name__ for k in kinds if isinstance(engine.optimizer, k)],
                       sum(p.numel() for p in partitions), {p.dtype for p in partitions})
    try:
        DeepSpeedZeroOptimizer()
    except TypeError as exc:
        found["build"] = str(exc)
    return found, sum(p.numel() for p in make_model().parameters())


def test_deepspeeds_optimizer_classes_answer_isinstance_for_the_engines_optimizer_at_each_stage():
    found, numel = run_ranks(_optimizer_kinds, 1, timeout=120)[0]
    assert found["stage 2"][0] == ["DeepSpeedZeroOptimizer"]
    assert found["stage 3"][0] == ["DeepSpeedZeroOptimizer_Stage3"]
    assert found["stage 0 bf16"][0] == ["BF16_Optimizer"]
    for name in ("stage 2", "stage 3", "stage 0 bf16"):  # one rank: the whole model's fp32 masters
        assert found[name][1] >= numel and found[name][2] == {torch.float32}, (name, found[name])
    assert "not a class to build" in found["build"]


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)
        self.second.weight = self.first.weight  # tied: one parameter, two names

    def forward(self, x):
        return self.second(self.first(x)).square().mean()


def _zero_to_fp32_as_deepspeed(rank, world, root):
    import dstrain.as_deepspeed  # the alias first: `deepspeed` is dstrain from here on

    # isort: split
    from deepspeed.utils.zero_to_fp32 import (
        convert_zero_checkpoint_to_fp32_state_dict,
        get_fp32_state_dict_from_zero_checkpoint,
    )

    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "optimizer": ADAMW}
    engine, *_ = dstrain.initialize(model=_Tied(), config=cfg)
    engine.backward(engine(torch.randn(2, 6)))
    engine.step()
    engine.save_checkpoint(root, tag="t")
    if rank != 0:
        return None
    with dstrain.zero.GatheredParameters(list(engine.module.parameters())):
        trained = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
    state = get_fp32_state_dict_from_zero_checkpoint(root)  # the tag from `latest`
    fresh = _Tied()
    fresh.load_state_dict(state, strict=True)  # both names of the tied weight are there
    whole = convert_zero_checkpoint_to_fp32_state_dict(root, f"{root}/out")
    sharded = convert_zero_checkpoint_to_fp32_state_dict(root, f"{root}/sharded", max_shard_size=200,
                                                         safe_serialization=True, tag="t")
    index = json.loads(sharded.read_text())
    from_bin = torch.load(whole, weights_only=True)
    return (sorted(state) == sorted(trained) and all(torch.equal(state[k], trained[k]) for k in trained),
            whole.name, all(torch.equal(from_bin[k], trained[k]) for k in trained), sharded.name,
            len(set(index["weight_map"].values())), sorted(index["weight_map"]) == sorted(trained))


def test_zero_to_fp32_reads_what_save_checkpoint_wrote_and_writes_deepspeeds_files(tmp_path):
    same, whole, same_bin, index, files, all_names = run_ranks(_zero_to_fp32_as_deepspeed, 2, str(tmp_path),
                                                               timeout=180)[0]
    assert same and whole == "pytorch_model.bin" and same_bin
    assert index == "model.safetensors.index.json" and files > 1 and all_names
