"""Migration is one line: an unchanged DeepSpeed script runs under the dstrain launcher (which resolves its
`import deepspeed` to dstrain), DeepSpeed's module paths resolve, and dstrain behaves as DeepSpeed where
scripts rely on it."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 100,
          "optimizer": {"type": "Adam", "params": {"lr": 0.5}},  # the client's optimizer must win over this
          "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}},  # and its scheduler too
          "zero_optimization": {"stage": 1}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unchanged_deepspeed_script_runs_under_the_launcher(tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(CONFIG))
    run = subprocess.run([sys.executable, "-m", "dstrain.launcher", "--num_procs", "2", "--master_port",
                          str(_free_port()), str(HERE / "migration" / "cifar_style.py"), "--deepspeed",
                          "--deepspeed_config", str(config), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["device"] == "cpu" and result["backend"] == "gloo" and result["elapsed_ok"]
        assert result["optimizer"] == "FusedAdam" and len(result["client_wins"]) == 2  # optimizer and scheduler
        assert "FusedAdam" in result["client_wins"][0] and "Adam" in result["client_wins"][0]
        assert result["lrs"] == [0.02, 0.01]  # WarmupLR kept each group's own lr
        assert result["sum"] == 3.0 and result["global_rank_of_1"] == 1 and result["dp"] == 2
        assert result["steps"] == 12 and result["client_args_out"] == str(tmp_path)
        assert result["grad_norm"] > 0 and result["cpu_adam"] is True
        assert result["offload_enum"] == "cpu" and result["config_class"] == "DeepSpeedConfig"
    assert results[0]["head_weight_sum"] == results[1]["head_weight_sum"]
    assert "trained 12 steps" in run.stderr
    assert "optimizer FusedAdam, scheduler WarmupLR" in run.stderr  # the banner names what trains


def test_the_alias_can_be_turned_off(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import deepspeed\n")
    run = subprocess.run([sys.executable, "-m", "dstrain.launcher", "--num_procs", "1", "--master_port",
                          str(_free_port()), "--no_deepspeed_alias", str(script)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode != 0 and "No module named 'deepspeed'" in run.stderr


def test_mapped_paths_and_the_readme_table_agree():
    from dstrain.as_deepspeed import MAPPED_PATHS

    readme = (HERE.parent / "README.md").read_text()
    for path, target in MAPPED_PATHS.items():
        assert f"`{path}`" in readme and f"`{target}`" in readme, path


SNIPPET = """
import dstrain.as_deepspeed
import deepspeed
from deepspeed.utils import RepeatingLoader
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
assert deepspeed.initialize is not None and OffloadDeviceEnum.nvme == "nvme"
try:
    import deepspeed.inference
except ImportError as exc:
    print("unmapped:", exc)
"""


def test_the_one_line_import_resolves_deepspeed_paths_and_names_what_is_not_mapped():
    run = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "unmapped: deepspeed.inference: dstrain maps only" in run.stdout


def test_a_real_deepspeed_is_never_shadowed_silently(tmp_path):
    fake = tmp_path / "deepspeed"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    code = "import dstrain.as_deepspeed"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "a real DeepSpeed is installed here" in refused.stderr
    shadowed = subprocess.run([sys.executable, "-W", "always", "-c", code + "; import deepspeed; "
                               "print(hasattr(deepspeed, 'REAL'))"], capture_output=True, text=True, timeout=120,
                              env={**env, "DSTRAIN_SHADOW_DEEPSPEED": "1"})
    assert shadowed.returncode == 0 and shadowed.stdout.strip() == "False" and "shadowing" in shadowed.stderr


@pytest.mark.parametrize("path", ["deepspeed.pipe", "deepspeed.moe.layer"])
def test_a_path_whose_library_is_missing_names_it(path):
    import importlib.util

    library = "dspipe" if "pipe" in path else "dsmoe"
    if importlib.util.find_spec(library) is not None:
        pytest.skip(f"{library} is installed here")
    run = subprocess.run([sys.executable, "-c", f"import dstrain.as_deepspeed, {path}"], capture_output=True,
                         text=True, timeout=120)
    assert f"pip install {library}" in run.stderr
