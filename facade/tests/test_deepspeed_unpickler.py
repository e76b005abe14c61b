"""DeepSpeed's files are pickles, read only through the restricted unpickler: a pickle that would run code
is refused naming the file and the global, and nothing runs; DeepSpeed's own objects become plain data."""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import interop_models as im
import numpy as np
import pytest
import torch

import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint.deepspeed.unpickler import RECORD_CLASS_KEY, load_pickle
from dstrain.errors import CheckpointLoadError

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed"


class RunsCode:
    """Unpickled, this would run a shell command that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class RunsPython:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


class FakeLossScaler:
    """Pickled under DeepSpeed's name, as DeepSpeed pickles its loss scaler."""

    def __init__(self):
        self.cur_scale, self.cur_iter, self.last_overflow_iter, self.cur_hysteresis = 1024.0, 40, 31, 2


FakeLossScaler.__module__ = "deepspeed.runtime.fp16.loss_scaler"
FakeLossScaler.__qualname__ = FakeLossScaler.__name__ = "DynamicLossScaler"


def plant(directory: Path, payload) -> Path:
    """A copy of DeepSpeed's ZeRO-2 fixture whose model-states file carries `payload` in its client state."""
    shutil.copytree(FIXTURES / "zero2_fp32", directory)
    model_file = directory / "global_step3" / "mp_rank_00_model_states.pt"
    state = load_pickle(model_file)
    state["innocent_looking"] = payload
    # The tensors read are mapped from the file: write beside it and rename, never over it in place.
    torch.save(state, model_file.with_suffix(".tmp"))
    os.replace(model_file.with_suffix(".tmp"), model_file)
    return model_file


def load(rank, world, directory):
    engine, *_ = dstrain.initialize(model=im.make_lm(), config=im.config(2, dp_size=world))
    try:
        engine.load_checkpoint(directory)
    except CheckpointLoadError as exc:
        return str(exc), engine.global_steps
    return None, engine.global_steps


@pytest.mark.parametrize("payload", [RunsCode, RunsPython])
def test_a_crafted_model_states_file_is_refused_and_runs_nothing(tmp_path, payload):
    marker = tmp_path / "code_ran"
    model_file = plant(tmp_path / "ckpt", payload(marker))
    message, steps = run_ranks(load, 1, str(tmp_path / "ckpt"), timeout=120)[0]
    assert not marker.exists()
    assert message is not None and str(model_file) in message
    assert ("posix.system" in message) if payload is RunsCode else ("subprocess.call" in message)
    assert steps == 0  # nothing was loaded


def test_a_plain_pickle_outside_torchs_zip_format_is_refused_too(tmp_path):
    marker = tmp_path / "code_ran"
    file = tmp_path / "mp_rank_00_model_states.pt"
    file.write_bytes(pickle.dumps({"module": {}, "x": RunsCode(marker)}, protocol=2))
    with pytest.raises(CheckpointLoadError, match=r"posix\.system"):
        load_pickle(file)
    assert not marker.exists()


def test_deepspeeds_objects_become_plain_data(tmp_path, monkeypatch):
    file = tmp_path / "state.pt"
    rng = np.random.RandomState(3).get_state()
    # Pickling names the class by its module, which pickle imports: stand in for DeepSpeed's while saving only.
    for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.fp16", "deepspeed.runtime.fp16.loss_scaler"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["deepspeed.runtime.fp16.loss_scaler"].DynamicLossScaler = FakeLossScaler
    torch.save({"loss_scaler": FakeLossScaler(), "args": argparse.Namespace(lr=0.1, layers=[2, 3]),
                "np_rng_state": rng, "loss": np.float64(2.5), "shape": torch.Size([2, 3]),
                "dtype": torch.bfloat16, "weights": torch.arange(6.0).view(2, 3)}, file)
    monkeypatch.undo()
    assert "deepspeed" not in sys.modules
    state = load_pickle(file)
    assert state["loss_scaler"] == {RECORD_CLASS_KEY: "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                                    "cur_scale": 1024.0, "cur_iter": 40, "last_overflow_iter": 31, "cur_hysteresis": 2}
    assert state["args"] == argparse.Namespace(lr=0.1, layers=[2, 3])
    assert state["np_rng_state"][0] == "MT19937" and np.array_equal(state["np_rng_state"][1], rng[1])
    assert state["loss"] == 2.5 and type(state["loss"]) is float
    assert state["shape"] == (2, 3) and state["dtype"] is torch.bfloat16
    assert torch.equal(state["weights"], torch.arange(6.0).view(2, 3))


def test_the_dynamic_loss_scaler_maps_to_dszeros_state():
    from dstrain.checkpoint.deepspeed.reader import loss_scaler_state

    record = {RECORD_CLASS_KEY: "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "cur_scale": 1024.0,
              "cur_iter": 40, "last_overflow_iter": 31, "cur_hysteresis": 2, "scale_window": 1000}
    assert loss_scaler_state({"loss_scaler": record}) == {"scale": 1024.0, "hysteresis_left": 2, "steps": 40,
                                                          "last_overflow_step": 31}


def test_a_truncated_or_foreign_file_is_a_clear_error(tmp_path):
    file = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    source = FIXTURES / "zero2_fp32" / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    file.write_bytes(source.read_bytes()[:1000])
    with pytest.raises(CheckpointLoadError, match=re.escape(str(file))):
        load_pickle(file)
    file.write_text("not a checkpoint")
    with pytest.raises(CheckpointLoadError, match="truncated or corrupt"):
        load_pickle(file)


def test_a_record_past_the_end_of_the_file_is_an_error_not_a_crash(tmp_path):
    """The tensors are mapped, not read: a record that claims bytes the file does not have would be a bus
    error on first touch, so the archive's records are checked against the file's size first."""
    file = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"t": torch.arange(100_000.0)}, file)
    data = bytearray(file.read_bytes())
    directory = data.rfind(b"PK\x01\x02")  # the central directory's first entry: the data.pkl record
    while directory != -1:
        size_at = directory + 20  # its compressed size: claim a gigabyte
        data[size_at:size_at + 4] = (2**30).to_bytes(4, "little")
        directory = data.rfind(b"PK\x01\x02", 0, directory)
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointLoadError, match=r"past the end|not a readable"):
        load_pickle(file)
