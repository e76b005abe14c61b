"""DeepSpeed names its own unit tests use (issue 35, round 4), resolved under the alias and used: the `log_level`
key (v1/test_engine_log_level.py: `runtime.config.get_log_level`, `runtime.constants.LOG_LEVEL_DEFAULT`,
`engine.log_level()`, `deepspeed.utils.logging.logger` at the level after initialize) and the
`zero_optimization.leaf_module` key (runtime/zero/test_zero_leaf_module.py: `runtime.zero.leaf_module_config`'s
defaults, a string taken as one name, a leaf marked by the config at initialize). One subprocess: the alias is
process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import logging, os, sys
import deepspeed, torch
from deepspeed.runtime.config import get_log_level
from deepspeed.runtime.constants import LOG_LEVEL_DEFAULT
from deepspeed.runtime.engine import DeepSpeedEngine
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.leaf_module_config import (DEFAULT_LEAF_MODULE_CLASSES, DEFAULT_LEAF_MODULE_NAMES,
                                                       DEFAULT_LEAF_MODULE_NAME_SUFFIXES)
from deepspeed.utils import logging as ds_logging
from deepspeed.utils import z3_leaf_module

assert get_log_level({}) is None and LOG_LEVEL_DEFAULT is None
assert [get_log_level({"log_level": v}) for v in ("DEBUG", "error")] == ["DEBUG", "error"]
try:
    get_log_level({"log_level": "loud"})
    raise SystemExit("an unknown log level was accepted")
except Exception as exc:
    assert "log_level" in str(exc) and "critical" in str(exc), exc
assert ds_logging.get_log_level_from_string("Warning") == logging.WARNING and ds_logging.log_levels["info"] == 20

config = DeepSpeedZeroConfig()
assert (config.leaf_module.classes, config.leaf_module.names, config.leaf_module.name_suffixes) == (
    DEFAULT_LEAF_MODULE_CLASSES, DEFAULT_LEAF_MODULE_NAMES, DEFAULT_LEAF_MODULE_NAME_SUFFIXES)
assert "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock" in DEFAULT_LEAF_MODULE_CLASSES
config = DeepSpeedZeroConfig(leaf_module={"classes": "my.Class", "names": "submodule", "name_suffixes": "tail"})
assert (config.leaf_module.classes, config.leaf_module.names, config.leaf_module.name_suffixes) == (
    ["my.Class"], ["submodule"], ["tail"])

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)))
ds_logging.logger.setLevel(logging.DEBUG)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_batch_size": 2, "log_level": "ERROR", "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 3, "leaf_module": {"names": ["1"]}}})
assert engine.log_level() == "ERROR" and DeepSpeedEngine.log_level(engine) == "ERROR"
assert ds_logging.logger.getEffectiveLevel() == logging.ERROR
assert z3_leaf_module(model[1]) and not z3_leaf_module(model[0])
loss = engine(torch.ones(2, 4)).sum()
engine.backward(loss)
engine.step()
print("ok")
"""


def test_round4_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
