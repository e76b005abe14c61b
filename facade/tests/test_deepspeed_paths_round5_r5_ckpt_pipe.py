"""DeepSpeed names its own unit tests use (issue 35, round 5: launcher/test_run.py, test_multinode_runner.py,
test_ds_arguments.py, test_user_args.py; checkpoint/test_zero_optimizer.py), resolved under the alias and used: the
runner's hostfile and filter parsers, `main(args=...)` raising, `parse_args` / `encode_world_info`, the multinode
runner classes, `deepspeed.utils.numa.parse_range_list`; the ZeRO optimizer's `state` and the engine's
`_get_optimizer_ckpt_name` (the file of a saved checkpoint that holds the rank's optimizer state, which a load
without optimizer states never asks for); `deepspeed.runtime.checkpoint_engine`'s TorchCheckpointEngine, which
`PipelineModule.save_state_dict` / `load_state_dir` take (checkpoint/test_pipeline.py). One subprocess: the alias
is process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import os
from deepspeed.launcher import runner as dsrun
from deepspeed.launcher.multinode_runner import (MPICHRunner, MultiNodeRunner, MVAPICHRunner, OpenMPIRunner,
                                                 PDSHRunner, SlurmRunner)
from deepspeed.launcher.runner import encode_world_info, parse_args
from deepspeed.utils.numa import parse_range_list

hosts = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}
assert dsrun.parse_resource_filter(hosts, exclude_str="worker-1") == {"worker-0": [0, 1, 2, 3]}
assert dsrun.parse_resource_filter(hosts, include_str="worker-1:0,3") == {"worker-1": [0, 3]}
for kwargs in ({"include_str": "A", "exclude_str": "B"}, {"include_str": "worker-1:4"}):
    try:
        dsrun.parse_resource_filter(hosts, **kwargs)
        raise SystemExit(f"{kwargs} was accepted")
    except ValueError:
        pass
assert dsrun._parse_hostfile(["worker-1 slots=2", "# c", "", "localhost slots=1"]) == {"worker-1": 2, "localhost": 1}
try:
    dsrun.main(args="--num_nodes 1 --num_gpus 1 -i localhost foo.py".split())
    raise SystemExit("a filter with counts was accepted")
except ValueError:
    pass
pool = {"worker-0": 4, "worker-1": 4}
world, args = encode_world_info(pool), parse_args(["test_launcher.py"])
assert OpenMPIRunner(args, world, pool).get_cmd(dict(os.environ), pool)[0] == "mpirun"
assert "eth0" in OpenMPIRunner(args, world, pool).get_cmd(dict(os.environ), pool)
assert [c(args, world, pool).get_cmd(dict(os.environ), pool)[0] for c in (MPICHRunner, MVAPICHRunner, SlurmRunner)] == [
    "mpirun", "mpirun", "srun"]
cmd, _, env = PDSHRunner(args, world).get_cmd(dict(os.environ), {"worker-0": 4})
assert cmd[0] == "pdsh" and env["PDSH_RCMD_TYPE"] == "ssh"
assert issubclass(PDSHRunner, MultiNodeRunner)
assert parse_range_list("0,2-4,6,8-9") == [0, 2, 3, 4, 6, 8, 9]

import sys
from unittest.mock import patch
import deepspeed, torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
config = {"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}}
engines = []
for seed in (0, 1):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    engines.append(deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0])
saved, loaded = engines
loss = saved(torch.ones(2, 4)).sum()
saved.backward(loss)
saved.step()
saved.save_checkpoint("ckpt", tag="t1")
moments = [state["exp_avg"].clone() for state in saved.optimizer.state.values()]
assert moments and all(m.abs().sum() > 0 for m in moments)
path = saved._get_optimizer_ckpt_name("ckpt", "t1", 0)
assert os.path.isfile(path) and path.endswith(".safetensors") and os.sep + "t1" + os.sep in path, path
with patch.object(loaded, "_get_optimizer_ckpt_name", wraps=loaded._get_optimizer_ckpt_name) as asked:
    loaded.load_checkpoint("ckpt", tag="t1", load_optimizer_states=False)
    asked.assert_not_called()
assert all(not state for state in loaded.optimizer.state.values())  # no moments loaded
loaded.load_checkpoint("ckpt", tag="t1")
for before, state in zip(moments, loaded.optimizer.state.values()):
    assert torch.equal(before, state["exp_avg"])
assert loaded.optimizer.param_groups[0]["betas"] == saved.optimizer.param_groups[0]["betas"]

from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.checkpoint_engine import CheckpointEngine
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
ckpt_engine = TorchCheckpointEngine()
assert isinstance(ckpt_engine, CheckpointEngine) and ckpt_engine.is_data_parallel_writer(0)
ckpt_engine.save({"w": torch.arange(3.0), "n": 3, "s": "x", "l": [1, {"t": torch.ones(2)}]}, "state.safetensors")
back = ckpt_engine.load("state.safetensors", map_location="cpu")
assert torch.equal(back["w"], torch.arange(3.0)) and (back["n"], back["s"]) == (3, "x")
assert torch.equal(back["l"][1]["t"], torch.ones(2))
with open("state.safetensors", "rb") as handle:
    assert not handle.read(8).startswith(b"PK")  # not a torch.save zip: nothing to unpickle
modules = []
for seed in (0, 1):
    torch.manual_seed(seed)
    modules.append(PipelineModule(layers=[LayerSpec(torch.nn.Linear, 4, 4), LayerSpec(torch.nn.Linear, 4, 1)],
                                  num_stages=1))
modules[0].save_state_dict("pipe_ckpt", checkpoint_engine=ckpt_engine)
assert sorted(os.listdir("pipe_ckpt")) == ["layer_00-model_states.safetensors", "layer_01-model_states.safetensors"]
modules[1].load_state_dir("pipe_ckpt", checkpoint_engine=ckpt_engine)
for a, b in zip(modules[0].parameters(), modules[1].parameters()):
    assert torch.equal(a, b)
pipe_engine = deepspeed.initialize(model=modules[1], model_parameters=modules[1].parameters(), config={
    "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam"}})[0]
assert type(pipe_engine).__name__ == "PipelineEngine"
pipe_engine.empty_partition_cache()  # as on DeepSpeedEngine, which DeepSpeed's PipelineEngine subclasses
print("ok")
"""


def test_round5_launcher_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)


def test_the_cpu_accelerators_random_forks_the_cpu_generator():
    """runtime/pipe/test_pipe.py trains inside `get_accelerator().random().fork_rng(devices=[...],
    device_type=get_accelerator().device_name())`: on the CPU, torch's own fork_rng looks for torch.cpu's device
    generator, which does not exist."""
    import torch

    from dstrain.accelerator.cpu import CpuAccelerator

    accelerator = CpuAccelerator()
    random = accelerator.random()
    assert random.get_rng_state is torch.random.get_rng_state and random.manual_seed is torch.random.manual_seed
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    with random.fork_rng(devices=[accelerator.current_device_name()], device_type=accelerator.device_name()):
        torch.manual_seed(5)
        inside = torch.rand(3)
    assert torch.equal(torch.rand(3), expected) and not torch.equal(inside, expected)  # the state came back
    torch.manual_seed(1)
    with random.fork_rng(enabled=False, device_type="cpu"):
        torch.rand(3)
    assert not torch.equal(torch.rand(3), expected)  # disabled: nothing restored
    torch.manual_seed(1)
    try:
        with random.fork_rng(device_type="cpu"):
            torch.rand(3)
            raise KeyError("inside")
    except KeyError:
        pass
    assert torch.equal(torch.rand(3), expected)  # restored on an exception too
