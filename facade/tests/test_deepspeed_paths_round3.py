"""DeepSpeed names its own unit tests use (issue 35, round 3), resolved under the alias and used:
`deepspeed.elasticity` (tests/unit/elasticity/test_elastic.py's calls, WORLD_SIZE and the scheduler's
DEEPSPEED_ELASTICITY_CONFIG read from the environment), `deepspeed.checkpoint` (constants, inspectors, file
names), `deepspeed.runtime.config.DeepSpeedConfig` built from a dict or a file and given to initialize(), and
the safe_set_local_* helpers under `deepspeed.utils`. One subprocess: the alias is process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import json, os, sys, tempfile
import deepspeed, torch
from deepspeed.git_version_info import version as ds_version

# elasticity, as test_elastic.py calls it (with nothing but `import deepspeed`)
section = {"enabled": True, "max_train_batch_size": 10000, "micro_batch_sizes": [8, 12, 16, 17], "min_gpus": 32,
           "max_gpus": 1500, "min_time": 20, "version": 0.1}
batch, gpus = deepspeed.elasticity.compute_elastic_config(ds_config={"elasticity": section},
                                                          target_deepspeed_version=ds_version)
assert (batch, len(gpus)) == (9792, 23)
for bad_target in ("0.2", "0.3.7"):
    try:
        deepspeed.elasticity.compute_elastic_config({"elasticity": section}, bad_target)
        raise SystemExit("an old target version was accepted")
    except deepspeed.elasticity.config.ElasticityError as exc:
        assert "0.3.8" in str(exc)
v2 = dict(section, version=0.2, model_parallel_size=4, num_gpus_per_node=8)
os.environ["WORLD_SIZE"] = "16"
batch2, replicas = deepspeed.elasticity.compute_elastic_config({"elasticity": v2}, ds_version)
assert replicas == [4], replicas
del os.environ["WORLD_SIZE"]
try:
    deepspeed.elasticity.compute_elastic_config({"elasticity": v2}, ds_version)
    raise SystemExit("version 0.2 without a world size was accepted")
except deepspeed.elasticity.config.ElasticityConfigError as exc:
    assert "WORLD_SIZE" in str(exc)
os.environ["DEEPSPEED_ELASTICITY_CONFIG"] = json.dumps(dict(section, max_train_batch_size=27))
try:
    deepspeed.elasticity.ensure_immutable_elastic_config(section)
    raise SystemExit("a scheduler copy that differs was accepted")
except deepspeed.elasticity.config.ElasticityError as exc:
    assert "elasticity.max_train_batch_size = 10000" in str(exc) and "(27)" in str(exc), exc
os.environ["DEEPSPEED_ELASTICITY_CONFIG"] = json.dumps({"elasticity": section})  # a whole config, not the section
try:
    deepspeed.elasticity.ensure_immutable_elastic_config(section)
    raise SystemExit("a whole config as the scheduler's section was accepted")
except deepspeed.elasticity.config.ElasticityError as exc:
    assert "DEEPSPEED_ELASTICITY_CONFIG.elasticity: is not an elasticity key" in str(exc), exc
os.environ["DEEPSPEED_ELASTICITY_CONFIG"] = json.dumps(section)
deepspeed.elasticity.ensure_immutable_elastic_config(section)  # the same section: nothing to say
del os.environ["DEEPSPEED_ELASTICITY_CONFIG"]
from deepspeed.elasticity.config import ElasticityConfig
assert ElasticityConfig(section).max_acceptable_batch_size == 10000

# deepspeed.checkpoint: one set of names, under each path
import deepspeed.checkpoint.constants as constants
from deepspeed.checkpoint import (UNIVERSAL_CHECKPOINT_INFO, DeepSpeedCheckpoint, ZeROCheckpoint,
                                  get_model_3d_descriptor, model_3d_desc)
from deepspeed.checkpoint.utils import clone_tensors_for_torch_save, get_model_ckpt_name_for_rank
from dstrain.checkpoint.deepspeed.inspect import DeepSpeedCheckpoint as Inspector
assert DeepSpeedCheckpoint is Inspector and constants.UNIVERSAL_CHECKPOINT_INFO == UNIVERSAL_CHECKPOINT_INFO
assert get_model_ckpt_name_for_rank("ck/global_step0", "00") == os.path.join("ck/global_step0", "mp_rank_00_model_states.pt")
assert model_3d_desc(2, 2, 2).reshape(model_3d_desc(1, 1, 1))[0].get_data(0, 0) == [0, 4, 1, 5, 2, 6, 3, 7]

from deepspeed.runtime.activation_checkpointing import checkpointing as ds_checkpointing
assert ds_checkpointing is deepspeed.checkpointing

# DeepSpeedConfig from a dict and from a file, as DeepSpeed builds it; initialize() takes it
from deepspeed.runtime.config import ADAM_OPTIMIZER, DeepSpeedConfig, get_gradient_clipping
from deepspeed.monitor.tensorboard import TensorBoardMonitor
config = DeepSpeedConfig({"train_batch_size": 2, "tensorboard": {"enabled": True, "output_path": "tb/", "job_name": "t"},
                          "zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam", "params": {"lr": 0.1}}})
assert (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) == (2, 2, 1)
monitor = TensorBoardMonitor(config.monitor_config.tensorboard)
assert (monitor.enabled, monitor.output_path, monitor.job_name) == (True, "tb/", "t")
assert config.zero_optimization_stage == 2 and config.zero_config.stage == 2 and config.zero_enabled
assert config.optimizer_name.lower() == ADAM_OPTIMIZER and config._param_dict["train_batch_size"] == 2
assert get_gradient_clipping({"gradient_clipping": 1.5}) == 1.5
from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
assert get_bfloat16_config({"bfloat16": {"enabled": True}}).enabled and get_bfloat16_config({"bf16": {"enabled": True}}).enabled
assert not get_bfloat16_config({}).enabled and get_float16_config({"fp16": {"enabled": True}}).initial_scale_power == 16
try:
    DeepSpeedConfig({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2})
    raise SystemExit("a batch triple that does not divide was accepted")
except deepspeed.DeepSpeedConfigError as exc:
    assert "train_batch_size" in str(exc)
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "ds.json")
    with open(path, "w") as handle:
        json.dump({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, handle)
    assert DeepSpeedConfig(path).train_batch_size == 8
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
model = torch.nn.Linear(4, 2)
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
assert engine.train_batch_size() == 2 and engine.zero_optimization_stage() == 2

from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig
assert DeepSpeedZeroOffloadOptimizerConfig(ratio=0.3).ratio == 0.3

# safe_set_local_*: this rank's piece (the whole parameter at one rank)
from deepspeed.utils import (safe_get_local_fp32_param, safe_get_local_optimizer_state, safe_set_local_fp32_param,
                             safe_set_local_optimizer_state, safe_set_full_optimizer_state,
                             safe_update_full_grad_vectorized)
loss = engine(torch.ones(2, 4)).sum()
engine.backward(loss)
engine.step()
shared = engine.module(torch.ones(2, 4)).sum()  # DeepSpeed's shared-loss pattern: the module, autograd, epilogue
shared.backward()
engine._backward_epilogue()
engine.step()
safe_set_local_fp32_param(model.weight, torch.full((8,), 0.5))
assert torch.all(safe_get_local_fp32_param(model.weight) == 0.5) and torch.all(model.weight == 0.5)
safe_set_local_optimizer_state(model.weight, torch.arange(8.0), "exp_avg")
assert torch.equal(safe_get_local_optimizer_state(model.weight, "exp_avg"), torch.arange(8.0))
safe_set_full_optimizer_state(model.weight, torch.ones(2, 4), "exp_avg_sq")
assert torch.all(safe_get_local_optimizer_state(model.weight, "exp_avg_sq") == 1)
print("ok")
"""


def test_round3_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
