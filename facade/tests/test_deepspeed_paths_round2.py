"""DeepSpeed module paths its own unit tests import (issue 35, round 2), each resolved under the alias and used:
`deepspeed.runtime.zero.config` (tests/unit/runtime/zero/test_zero_config.py's expectations),
`deepspeed.monitor.*` (tests/unit/monitor/test_monitor.py's imports, a CSV monitor writing real files) and
`deepspeed.profiling.flops_profiler` (a profile of a real model), `deepspeed.runtime.pipe.schedule`. One subprocess: the alias is process-wide."""

import subprocess
import sys

import pytest

SNIPPET = r"""
import dstrain.as_deepspeed
import csv, os, sys, warnings
import deepspeed, torch
from deepspeed.runtime.zero.config import (DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig,
                                           DeepSpeedZeroOffloadParamConfig)
from deepspeed.monitor.tensorboard import TensorBoardMonitor
from deepspeed.monitor.wandb import WandbMonitor
from deepspeed.monitor.csv_monitor import csvMonitor
from deepspeed.monitor.config import DeepSpeedMonitorConfig
from deepspeed.monitor.comet import CometMonitor
from deepspeed.monitor.monitor import MonitorMaster
from deepspeed.profiling.flops_profiler import FlopsProfiler, get_model_profile
import dsconfig, dsmonitor
import deepspeed.runtime.pipe.schedule as schedule
from deepspeed.utils import (safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                             safe_set_full_grad)
import dszero

# ZeRO config: DeepSpeed's deprecated keys, aliases and stage-dependent defaults
assert isinstance(DeepSpeedZeroConfig(cpu_offload_param=True).offload_param, DeepSpeedZeroOffloadParamConfig)
assert isinstance(DeepSpeedZeroConfig(cpu_offload=True).offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig)
assert DeepSpeedZeroConfig(stage3_gather_fp16_weights_on_model_save=True).gather_16bit_weights_on_model_save
assert DeepSpeedZeroConfig(stage3_prefetch_bucket_size=12345).prefetch_bucket_size == 12345
assert DeepSpeedZeroConfig(stage3_param_persistence_threshold=12345).param_persistence_threshold == 12345
assert DeepSpeedZeroConfig(stage3_max_reuse_distance=12345).max_reuse_distance == 12345
assert [DeepSpeedZeroConfig(stage=s).overlap_comm for s in range(4)] == [False, False, False, True]
assert DeepSpeedZeroConfig(stage=3, overlap_comm=False).overlap_comm is False
assert DeepSpeedZeroConfig(stage=1).pipeline_loading_checkpoint is False
assert DeepSpeedZeroConfig().offload_param is None and DeepSpeedZeroConfig(offload_optimizer=None).offload_optimizer is None
both = DeepSpeedZeroConfig(offload_param={}, offload_optimizer={})
assert isinstance(both.offload_param, DeepSpeedZeroOffloadParamConfig) and both.offload_param.device == "cpu"
assert [DeepSpeedZeroOffloadOptimizerConfig(pipeline_read=r, pipeline_write=w).pipeline
        for r, w in ((False, False), (True, False), (False, True))] == [False, True, True]
assert deepspeed.runtime.zero.config.DeepSpeedZeroConfig is DeepSpeedZeroConfig  # an attribute, as in DeepSpeed
for bad, word in (({"stage": 7}, "zero_optimization.stage"), ({"stage3_prefetch_bucket_size": -1}, "prefetch"),
                  ({"pipeline_loading_checkpoint": True}, "pipeline_loading_checkpoint"), ({"stagee": 1}, "stagee")):
    try:
        DeepSpeedZeroConfig(**bad)
    except dsconfig.ConfigError as exc:
        assert word in str(exc), exc
    else:
        raise AssertionError(f"accepted {bad}")

# monitors: DeepSpeed's submodules are dsmonitor's classes, configured by dsconfig's sections
assert csvMonitor is dsmonitor.CSVMonitor and TensorBoardMonitor is dsmonitor.TensorBoardMonitor
assert WandbMonitor is dsmonitor.WandbMonitor and CometMonitor is dsmonitor.CometMonitor
assert MonitorMaster is dsmonitor.MonitorMaster and deepspeed.monitor is dsmonitor
defaults = DeepSpeedMonitorConfig()
assert not defaults.enabled and defaults.tensorboard.job_name == "DeepSpeedJobName" and defaults.wandb.project == "deepspeed"
out = sys.argv[1]
cfg = DeepSpeedMonitorConfig(csv_monitor={"enabled": True, "output_path": out, "job_name": "job"})
monitor = csvMonitor(cfg.csv_monitor)
assert cfg.enabled and (monitor.enabled, monitor.output_path, monitor.job_name) == (True, out, "job")
monitor.write_events([("Train/Samples/loss", 0.5, 4), ("Train/Samples/loss", 0.25, 8)])
monitor.close()
with open(os.path.join(out, "job", "Train_Samples_loss.csv")) as f:
    rows = list(csv.reader(f))
assert rows[1:] == [["4", "0.5"], ["8", "0.25"]], rows
for bad in ({"csv_monitor": {"enabled": "maybe"}}, {"tensorbored": {}}):
    try:
        DeepSpeedMonitorConfig(**bad)
    except (dsconfig.ConfigError, TypeError) as exc:
        assert "csv_monitor.enabled" in str(exc) or "tensorbored" in str(exc), exc
    else:
        raise AssertionError(f"accepted {bad}")

# the flops profiler under DeepSpeed's path: a Linear(10, 5) forward of batch 2 is 100 MACs, 55 parameters
flops, macs, params = get_model_profile(torch.nn.Linear(10, 5), input_shape=(2, 10), print_profile=False,
                                        as_string=False)
assert (macs, params) == (100, 55) and flops == 2 * macs, (flops, macs, params)
assert deepspeed.profiling.flops_profiler.FlopsProfiler is FlopsProfiler is dsmonitor.FlopsProfiler
# DeepSpeed's step-wise pipeline schedule: the last of 3 stages never sends activations, one optimizer step
sched = schedule.TrainSchedule(micro_batches=4, stages=3, stage_id=2)
steps = list(sched)
assert len(steps) == 2 * (4 + 3 - 1) and sched.is_last_stage and not sched.is_first_stage
assert not any(isinstance(c, (schedule.SendActivation, schedule.RecvGrad)) for step in steps for c in step)
assert sum(isinstance(c, schedule.BackwardPass) for step in steps for c in step) == 4
assert steps[-1][-1] == schedule.OptimizerStep() and deepspeed.runtime.pipe.schedule is schedule
# the fragment API's local functions are dszero's (their behaviour: dszero's tests/test_fragments.py)
assert (safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state, safe_set_full_grad) == (
    dszero.safe_get_local_fp32_param, dszero.safe_get_local_grad, dszero.safe_get_local_optimizer_state,
    dszero.safe_set_full_grad)
print("round2 paths ok")
"""


def test_zero_config_monitor_and_flops_profiler_paths_resolve_and_work(tmp_path):
    run = subprocess.run([sys.executable, "-c", SNIPPET, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "round2 paths ok" in run.stdout


@pytest.mark.parametrize("raw", [[], "stage", 3])
def test_load_section_refuses_a_section_that_is_not_a_mapping(raw):
    import dsconfig

    with pytest.raises(dsconfig.ConfigError, match="zero_optimization"):
        dsconfig.load_section("zero_optimization", raw)
