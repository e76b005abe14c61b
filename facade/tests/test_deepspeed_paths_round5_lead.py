"""DeepSpeed names its own unit tests use (issue 35, round 5; runtime/zero/test_zero_context.py), resolved under the
alias and used: `partition_parameters.MultipleAllGatherHandles` and `partitioned_param_data_shape`,
`deepspeed.zero.register_external_parameter` and a parameter read outside its module's forward found by itself
(a parent reusing its child's weight), `engine.tput_timer`, and `runtime.utils.PartitionedTensor`. One subprocess: the alias is process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import os, sys
import deepspeed, torch
from deepspeed.runtime.utils import PartitionedTensor
from deepspeed.runtime.zero.partition_parameters import (MultipleAllGatherHandles, ZeroParamStatus,
                                                         partitioned_param_data_shape)

class Handle:
    def __init__(self):
        self.flag = None
    def wait(self, handle_dependency=True):
        self.flag = handle_dependency

class Plain:  # a torch.distributed Work-like handle: wait() takes no flag
    waited = False
    def wait(self):
        self.waited = True

handles = [Handle(), Plain()]
MultipleAllGatherHandles(handles).wait(handle_dependency=False)
assert handles[0].flag is False and handles[1].waited

class ParentReadsChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 8)
    def forward(self, x):
        return torch.nn.functional.linear(self.second(self.first(x)), self.first.weight).sum()

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1}}
for register in (False, True):
    torch.manual_seed(0)
    model = ParentReadsChild()
    if register:
        deepspeed.zero.register_external_parameter(model, model.first.weight)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    assert model.first.weight.ds_status == ZeroParamStatus.NOT_AVAILABLE
    assert list(model.first.weight.shape) == partitioned_param_data_shape
    for _ in range(6):
        engine.backward(engine(torch.ones(2, 8)))
        engine.step()
    assert engine.tput_timer.batch_size == 6 and engine.tput_timer.global_step_count == 2
    assert engine.tput_timer.micro_step_count == 6 and engine.tput_timer.initialized
    whole = torch.arange(12.0).reshape(3, 4)
    part = PartitionedTensor(whole, group=None)
    assert torch.equal(PartitionedTensor.from_meta(part.to_meta(), part.data(), None).full(), whole)
    engine.destroy()
print("ok")
"""


def test_round5_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
