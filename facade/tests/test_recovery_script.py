"""A ZeRO save leaves zero_to_fp32.py beside its checkpoints, as DeepSpeed's does: run in the checkpoint folder
(`python zero_to_fp32.py . out/`), it writes the consolidated fp32 weights. The file is replaced whole (a link
planted under its name or its temporary name is replaced, never written through), and a file system that refuses
the execute bit is logged, not fatal."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks


def save_and_gather(rank, world, root, stage):
    engine, *_ = dstrain.initialize(model=make_model(0), config=config(stage=stage, optimizer=ADAMW))
    data = TokenDataset().data
    engine.backward(engine(data[rank * 4:(rank + 1) * 4]))
    engine.step()
    engine.save_checkpoint(root)
    return {name: value.detach().float().clone() for name, value in engine.module.state_dict().items()}


def test_a_zero_save_leaves_a_working_zero_to_fp32_script(tmp_path):
    root = tmp_path / "ckpt"
    weights = run_ranks(save_and_gather, 2, str(root), 2, timeout=180)[0]
    script = root / "zero_to_fp32.py"
    assert script.is_file() and os.access(script, os.X_OK)
    done = subprocess.run([sys.executable, "zero_to_fp32.py", ".", str(tmp_path / "out")], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    written = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True)
    assert set(written) == set(weights)
    for name, value in weights.items():
        assert torch.equal(written[name].float(), value), name


def test_a_stage_0_save_writes_no_script(tmp_path):
    run_ranks(save_and_gather, 1, str(tmp_path), 0, timeout=180)
    assert not (tmp_path / "zero_to_fp32.py").exists()


def test_links_planted_under_the_scripts_names_are_replaced_not_followed(tmp_path):
    from dstrain.checkpoint.recovery_script import write_recovery_script

    victim, other = tmp_path / "victim.txt", tmp_path / "other.txt"
    victim.write_text("precious")
    other.write_text("precious too")
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "zero_to_fp32.py").symlink_to(victim)
    (root / "zero_to_fp32.py.tmp").symlink_to(other)
    written = write_recovery_script(root)
    assert victim.read_text() == "precious" and other.read_text() == "precious too"
    assert not written.is_symlink() and "zero_to_fp32" in written.read_text()
    assert not (root / "zero_to_fp32.py.tmp").exists()


def test_a_refused_execute_bit_is_logged_and_the_save_goes_on(tmp_path, caplog):
    from dstrain.checkpoint.recovery_script import make_executable

    with caplog.at_level(logging.INFO, logger="dstrain"):
        make_executable(tmp_path / "missing" / "zero_to_fp32.py")
    assert "could not make" in caplog.text and "run it with python" in caplog.text
    assert not Path(tmp_path / "missing").exists()
