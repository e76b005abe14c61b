"""What Hugging Face Transformers, Accelerate and DeepSpeed-Chat call on DeepSpeed, provided by the facade
(their own runs are in deepspeed-compat/tests, where the `deepspeed` distribution is announced): the engine's
consolidated 16-bit state dict, a stage-3 engine without an optimizer, Accelerate's config dict, and the
DeepSpeed module paths they import."""

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
