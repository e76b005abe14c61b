"""Offload at stage 3 (and NVMe optimizer offload at stage 2): the same training as without it.

Each case trains the small transformer for a few steps at 2 ranks and compares its losses and
final weights with stage 3 without offload; memory_report() says where the bytes went; swap files
really exist on disk.
"""

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig
from dszero.ops import CPUAdam

STEPS = 6


def train(rank, world, cfg, optimizer="adamw", micro=1):
    model = make_model()
    params = model.parameters()
    opt = (CPUAdam(params, lr=1e-2, weight_decay=0.01) if optimizer == "cpuadam"
           else torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01))
    zero = dszero.ZeroOptimizer(model, opt, cfg, gradient_clipping=0.5)
    losses = []
    for micro_batches in batches(STEPS, micro, world, rank):
        total = 0.0
        for tokens in micro_batches:
            loss = loss_of(model, tokens) / micro
            zero.backward(loss)
            total += loss.item()
        assert zero.step()
        zero.zero_grad()
        losses.append(total)
    report = zero.memory_report()
    with dszero.GatheredParameters(model.parameters()):
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, weights, report


def zero3(**kwargs):
    return ZeroConfig(stage=3, stage3_param_persistence_threshold=0, **kwargs)


def nvme_optimizer(path, **kwargs):
    return OffloadOptimizerConfig(device="nvme", nvme_path=str(path), **kwargs)


def nvme_params(path, **kwargs):
    return OffloadParamConfig(device="nvme", nvme_path=str(path), **kwargs)


def cases(tmp):
    """name -> (config, optimizer, gradient accumulation); 'plain' is the reference."""
    return {
        "plain": (zero3(), "adamw", 2),
        "optimizer_cpu": (zero3(offload_optimizer=OffloadOptimizerConfig(device="cpu")), "adamw", 2),
        "param_cpu": (zero3(offload_param=OffloadParamConfig(device="cpu")), "adamw", 2),
        "both_cpu": (zero3(offload_param=OffloadParamConfig(device="cpu"),
                           offload_optimizer=OffloadOptimizerConfig(device="cpu")), "adamw", 2),
        # Small buffers and sub-groups so several of each are in play on the tiny model.
        "param_nvme": (zero3(offload_param=nvme_params(tmp, max_in_cpu=3000, buffer_count=2, buffer_size=4096)),
                       "adamw", 2),
        "optimizer_nvme": (zero3(offload_optimizer=nvme_optimizer(tmp, buffer_count=4), sub_group_size=3000),
                           "adamw", 2),
        "both_nvme": (zero3(offload_param=nvme_params(tmp, max_in_cpu=0, buffer_count=3, buffer_size=4096),
                            offload_optimizer=nvme_optimizer(tmp, buffer_count=6), sub_group_size=5000),
                      "adamw", 2),
    }


def train_cases(rank, world, tmp, names):
    results = {name: train(rank, world, cfg, opt, micro) for name, (cfg, opt, micro) in cases(tmp).items()
               if name in names}
    gc.collect()  # the optimizers are garbage now, and their swap files go with them
    return results


def assert_same_training(got, reference, name):
    losses, weights, _ = got
    ref_losses, ref_weights, _ = reference
    assert losses == pytest.approx(ref_losses, rel=1e-6), name
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-6, atol=1e-6, msg=f"{name}: {key}")


def test_stage3_offload_trains_exactly_like_no_offload(tmp_path):
    names = list(cases(tmp_path))
    results = run_ranks(train_cases, 2, str(tmp_path), names, timeout=240)
    for per_rank in results:
        for name in names[1:]:
            assert_same_training(per_rank[name], per_rank["plain"], name)
    plain, pcpu, ocpu = (results[0][n][2] for n in ("plain", "param_cpu", "optimizer_cpu"))
    # Parameter offload moves the parameter shards (and only them) off the device.
    assert pcpu["cpu_offload_bytes"] == pcpu["parameters"] > 0
    assert pcpu["device_bytes"] == plain["device_bytes"] - plain["parameters"]
    # Optimizer offload moves the master weights (now a separate copy) and optimizer state.
    assert ocpu["cpu_offload_bytes"] == ocpu["master_weights"] + ocpu["optimizer_state"]
    assert ocpu["master_weights"] == plain["parameters"] and ocpu["optimizer_state"] == plain["optimizer_state"]
    pnvme, onvme, both = (results[0][n][2] for n in ("param_nvme", "optimizer_nvme", "both_nvme"))
    # max_in_cpu=3000 elements keep the first units in CPU memory; the rest are in the swap file.
    assert 0 < pnvme["cpu_offload_bytes"] - pnvme["offload_buffers"] <= 3000 * 4
    assert pnvme["nvme_bytes"] + pnvme["cpu_offload_bytes"] - pnvme["offload_buffers"] >= plain["parameters"]
    assert onvme["nvme_bytes"] >= onvme["master_weights"] + onvme["optimizer_state"]
    assert onvme["optimizer_state"] == pytest.approx(plain["optimizer_state"], rel=0.2)  # aligned regions
    assert both["device_bytes"] == plain["gradients"]  # nothing but gradients stays on the device
    for report in (pnvme, onvme, both):
        assert report["total"] == report["device_bytes"] + report["cpu_offload_bytes"] + report["nvme_bytes"]
    assert not any(tmp_path.iterdir())  # swap files go with their optimizer


def test_cpu_adam_with_stage3_cpu_optimizer_offload():
    def run(rank, world):
        offloaded = zero3(offload_optimizer=OffloadOptimizerConfig(device="cpu"))
        return train(rank, world, zero3(), "cpuadam"), train(rank, world, offloaded, "cpuadam")

    for plain, offloaded in run_ranks(run, 2, timeout=120):
        assert_same_training(offloaded, plain, "cpuadam")


def nvme_stage2(rank, world, tmp):
    plain = train(rank, world, ZeroConfig(stage=2, reduce_bucket_size=2000))
    cfg = ZeroConfig(stage=2, reduce_bucket_size=2000, offload_optimizer=nvme_optimizer(tmp), sub_group_size=100)
    return plain, train(rank, world, cfg)


def test_nvme_optimizer_offload_at_stage2(tmp_path):
    for plain, swapped in run_ranks(nvme_stage2, 2, str(tmp_path), timeout=120):
        assert_same_training(swapped, plain, "stage2-nvme")
        assert swapped[2]["nvme_bytes"] >= swapped[2]["master_weights"] + swapped[2]["optimizer_state"] > 0


def swap_files_while_training(rank, world, tmp):
    model = make_model()
    cfg = zero3(offload_param=nvme_params(tmp, max_in_cpu=0, buffer_size=4096),
                offload_optimizer=nvme_optimizer(tmp), sub_group_size=4000)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), cfg)
    tokens = next(batches(1, 1, world, rank))[0]
    zero.backward(loss_of(model, tokens))
    zero.step()
    sizes = {p.name: p.stat().st_size for p in Path(tmp).glob(f"dszero_*_rank{rank}_*/*.swp")}
    return sizes, zero.memory_report()


def test_swap_files_hold_what_memory_report_says(tmp_path):
    for sizes, report in run_ranks(swap_files_while_training, 2, str(tmp_path), timeout=60):
        assert set(sizes) == {"params.swp", "optimizer.swp"}
        assert sum(sizes.values()) >= report["nvme_bytes"] > 0


def checkpoint_roundtrip(rank, world, tmp):
    """Save under NVMe optimizer offload, load into a plain stage-3 optimizer: the next steps agree."""
    swapped_cfg = zero3(offload_optimizer=nvme_optimizer(Path(tmp) / "swap"), sub_group_size=3000)
    runs = []
    for cfg in (swapped_cfg, zero3()):
        model = make_model()
        zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), cfg)
        data = list(batches(4, 1, world, rank))
        losses = []
        for step, (tokens,) in enumerate(data):
            if step == 2 and cfg is swapped_cfg:
                zero.save(Path(tmp) / "ckpt")
            if step == 2 and cfg is not swapped_cfg:
                zero.load(Path(tmp) / "ckpt")
            loss = loss_of(model, tokens)
            zero.backward(loss)
            zero.step()
            zero.zero_grad()
            losses.append(loss.item())
        runs.append(losses)
    swapped, loaded = runs
    return swapped[2:], loaded[2:], zero.state_dict()["optimizer"]["state"][0]["exp_avg"].numel()


def test_checkpoint_of_nvme_offloaded_state_loads_anywhere(tmp_path):
    for swapped, loaded, state_numel in run_ranks(checkpoint_roundtrip, 2, str(tmp_path), timeout=120):
        assert loaded == pytest.approx(swapped, rel=1e-6)
        assert state_numel > 0


def bad(rank, world, cfg, what):
    model = make_model()
    try:
        zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), cfg)
        tokens = next(batches(1, 1, world, rank))[0]
        zero.backward(loss_of(model, tokens))
        zero.step()
    except dszero.ZeroConfigError as exc:
        return str(exc)
    return f"no error for {what}"


@pytest.mark.parametrize(("what", "make_cfg", "expected"), [
    ("param offload below stage 3", lambda t: ZeroConfig(stage=2, offload_param=OffloadParamConfig(device="cpu")),
     ["zero_optimization.offload_param", "needs stage 3"]),
    ("tiny param buffers", lambda t: zero3(offload_param=nvme_params(t, max_in_cpu=0, buffer_size=8)),
     ["zero_optimization.offload_param.buffer_size = 8", "at least"]),
    ("too few optimizer buffers", lambda t: zero3(offload_optimizer=nvme_optimizer(t, buffer_count=2)),
     ["zero_optimization.offload_optimizer.buffer_count = 2", "at least 3"]),
    ("nvme_path not a directory", lambda t: zero3(offload_optimizer=nvme_optimizer(Path(t) / "file" / "sub")),
     ["zero_optimization.offload_optimizer.nvme_path", "writable directory"]),
], ids=["param-stage2", "buffer-size", "buffer-count", "nvme-path"])
def test_bad_offload_settings_name_the_key(tmp_path, what, make_cfg, expected):
    (tmp_path / "file").write_text("not a directory")
    message = run_ranks(bad, 1, make_cfg(tmp_path), what, timeout=60)[0]
    for part in expected:
        assert part in message, message


PIN_SCRIPT = """
import warnings, torch, dszero
from dsconfig import OffloadOptimizerConfig, ZeroConfig
model = torch.nn.Linear(64, 64)
cfg = ZeroConfig(stage=3, offload_optimizer=OffloadOptimizerConfig(device="cpu", pin_memory=True))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), cfg)
model(torch.ones(2, 64)).sum().backward(); zero.step()
print("WARNINGS:", [str(w.message) for w in caught if "pin_memory" in str(w.message)])
"""


@pytest.mark.skipif(not shutil.which("prlimit"), reason="needs prlimit to lower the memlock limit")
def test_refused_pinning_warns_and_trains():
    command = ["prlimit", "--memlock=0:0", sys.executable, "-c", PIN_SCRIPT]
    if os.geteuid() == 0:  # root ignores the limit unless CAP_IPC_LOCK is dropped too
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv to drop CAP_IPC_LOCK")
        command = ["setpriv", "--bounding-set=-ipc_lock", *command]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("WARNINGS:"))
    assert "zero_optimization.offload_optimizer.pin_memory" in line and "ulimit -l" in line, line
