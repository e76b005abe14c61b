"""DeepSpeed names its own unit tests use (issue 35, round 6: the files whose run had timed out), resolved under the
alias and used: checkpoint/test_universal_checkpoint.py saves `client_state={UNIVERSAL_CHECKPOINT_INFO: {}, ...}`
and calls `deepspeed.checkpoint.ds_to_universal.main` with a `types.SimpleNamespace` of its arguments, then loads
the result with `"checkpoint": {"load_universal": true}`; v1/half_precision/test_gradient_clipping_default.py
reads `gradient_clipping`'s default (1.0) from the config helpers, the constants and the engine. One subprocess: the alias is process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import os, sys, tempfile, types
import deepspeed, torch
from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO
from deepspeed.checkpoint.ds_to_universal import main as convert_to_universal

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
config = {"train_batch_size": 4, "optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 1},
          "fp16": {"enabled": True, "initial_scale_power": 8}}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
for _ in range(2):
    loss = engine(torch.randn(4, 6, dtype=torch.half)).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
root = tempfile.mkdtemp()
engine.save_checkpoint(root, tag="test_tag", client_state={UNIVERSAL_CHECKPOINT_INFO: {}, "iteration": 2})
args = types.SimpleNamespace(input_folder=os.path.join(root, "test_tag"),
                             output_folder=os.path.join(root, "test_tag_universal"), num_extract_workers=1,
                             num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=False)
assert convert_to_universal(args) == 0
expected = {k: v.clone() for k, v in engine.state_dict().items()}
engine.destroy()

model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
engine, *_ = deepspeed.initialize(config=dict(config, checkpoint={"load_universal": True}), model=model,
                                  model_parameters=model.parameters())
engine.load_checkpoint(root, tag="test_tag_universal", load_optimizer_states=True)
for name, value in engine.state_dict().items():
    assert torch.equal(value, expected[name]), name
assert engine.gradient_clipping() == 1.0  # the key is absent: the reference's default, as DeepSpeed's engine answers
engine.destroy()

# v1/half_precision/test_gradient_clipping_default.py: the default is 1.0 everywhere DeepSpeed states it
from deepspeed.runtime.config import get_gradient_clipping
from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
from deepspeed.runtime.engine import DeepSpeedEngine

assert get_gradient_clipping({}) == GRADIENT_CLIPPING_DEFAULT == 1.0
assert get_gradient_clipping({"gradient_clipping": 0.0}) == 0.0
for value in (0.5, 0.0):
    assert DeepSpeedEngine.gradient_clipping(types.SimpleNamespace(_config=types.SimpleNamespace(
        gradient_clipping=value))) == value
print("ok")
"""


def test_round6_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
