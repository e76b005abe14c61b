"""The package itself: the `deepspeed` distribution it announces, `import deepspeed` in any Python of the
environment, DeepSpeed's commands, and its refusal beside a real DeepSpeed (a fake one's files planted: DeepSpeed
itself is never installed here)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import dstrain_deepspeed_compat
import pytest
from dstrain_deepspeed_compat.nvme_args import (
    NvmeArgumentError,
    ds_io_to_dsaio_bench,
    ds_nvme_tune_to_dsaio_tune,
)

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def python(code: str, *, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("DSTRAIN_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**merged, **(env or {})}, cwd=cwd)


def command(name: str, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("DSTRAIN_")}
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=120,
                          env={**merged, **(env or {})}, cwd=cwd)


def test_version_matches_installed_metadata():
    assert dstrain_deepspeed_compat.__version__ == importlib.metadata.version("dstrain-deepspeed-compat")


def test_the_deepspeed_distribution_has_a_version_transformers_and_accelerate_accept():
    version = importlib.metadata.version("deepspeed")
    assert version == f"{dstrain_deepspeed_compat.DEEPSPEED_API_VERSION}+dstrain.{dstrain_deepspeed_compat.__version__}"
    assert importlib.metadata.metadata("DeepSpeed")["Name"] == "deepspeed"
    assert "deepspeed" in importlib.metadata.packages_distributions()["deepspeed"]
    from accelerate.utils import compare_versions, is_deepspeed_available
    from transformers.dependency_versions_check import dep_version_check
    from transformers.integrations.deepspeed import is_deepspeed_available as transformers_sees_it

    assert transformers_sees_it() and is_deepspeed_available()
    dep_version_check("deepspeed")  # transformers' own minimum, checked by HfDeepSpeedConfig
    assert compare_versions("deepspeed", ">=", "0.16.4")


def test_import_deepspeed_is_dstrain_in_any_python_and_start_up_loads_nothing():
    run = python("import sys; before = sorted(m for m in ('dstrain', 'torch', 're') if m in sys.modules)\n"
                 "import deepspeed, dstrain\n"
                 "from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus\n"
                 "assert deepspeed is dstrain and deepspeed.zero.Init is dstrain.zero.Init\n"
                 "print(before)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"  # the start-up hook imports no dstrain, torch or even re


def test_the_alias_switch_turns_both_off_and_the_one_line_import_still_works():
    off = {"DSTRAIN_DEEPSPEED_ALIAS": "0"}
    run = python("import importlib.metadata as m, importlib.util as u\n"
                 "print(u.find_spec('deepspeed'))\n"
                 "try:\n    m.version('deepspeed')\nexcept m.PackageNotFoundError:\n    print('no metadata')\n"
                 "import dstrain.as_deepspeed, deepspeed; print(deepspeed.__name__)", env=off)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["None", "no", "metadata", "dstrain"]


def test_deepspeeds_commands_run_dstrains_tools(tmp_path):
    launcher = command("deepspeed", "--help")
    assert launcher.returncode == 0 and "--num_gpus" in launcher.stdout and "--hostfile" in launcher.stdout
    report = command("ds_report", "--json")
    assert report.returncode == 0, report.stderr
    assert "dstrain" in json.dumps(json.loads(report.stdout))
    universal = command("ds_to_universal", "--help")
    try:
        import dstrain.checkpoint.ds_to_universal  # noqa: F401
    except ImportError:
        assert universal.returncode != 0 and "dstrain.checkpoint.ds_to_universal" in universal.stderr
        assert "Nothing was converted" in universal.stderr
    else:
        assert universal.returncode == 0, universal.stderr
    io = command("ds_io", "--folder", str(tmp_path), "--io_size", "1M", "--loops", "1")
    assert io.returncode == 0 and "write 1M" in io.stdout, io.stderr
    refused = command("ds_io", "--folder", str(tmp_path), "--io_size", "1M", "--gpu", "--use_gds")
    assert refused.returncode != 0
    assert "--gpu is not supported" in refused.stderr and "--use_gds is not supported" in refused.stderr


def test_ds_io_and_ds_nvme_tune_flags_translate_or_are_refused_by_name():
    assert ds_io_to_dsaio_bench(["--folder", "/nvme", "--io_size", "400M", "--read", "--block_size", "4M",
                                 "--queue_depth", "64", "--io_parallel", "2", "--single_submit",
                                 "--sequential_requests"]) == [
        "--path", "/nvme", "--size", "400M", "--op", "read", "--block_size", "4M", "--queue_depth", "64",
        "--loops", "3", "--intra_op_parallelism", "2", "--single_submit", "--no_overlap_events"]
    # DeepSpeed's defaults where dsaio's differ: writes, queue depth 32, 3 loops.
    assert ds_io_to_dsaio_bench(["--folder", "/n", "--io_size", "1G"])[4:10] == ["--op", "write", "--block_size",
                                                                                   "1M", "--queue_depth", "32"]
    with pytest.raises(NvmeArgumentError, match="--engine torch_fastio"):
        ds_io_to_dsaio_bench(["--folder", "/n", "--io_size", "1G", "--engine", "torch_fastio"])
    with pytest.raises(NvmeArgumentError, match="--multi_process"):
        ds_io_to_dsaio_bench(["--folder", "/n", "--io_size", "1G", "--multi_process", "4"])
    with pytest.raises(NvmeArgumentError, match="io_size"):
        ds_io_to_dsaio_bench(["--folder", "/n"])
    assert ds_nvme_tune_to_dsaio_tune(["--nvme_dir", "/nvme", "--flush_page_cache"]) == [
        "--path", "/nvme", "--io_size", "400M", "--loops", "1"]
    with pytest.raises(NvmeArgumentError, match=r"--no_read is not supported.*--gds is not supported"):
        ds_nvme_tune_to_dsaio_tune(["--nvme_dir", "/nvme", "--no_read", "--gds"])
    with pytest.raises(NvmeArgumentError, match="2 folders"):
        ds_nvme_tune_to_dsaio_tune(["--nvme_dir", "/a", "/b"])


def plant_fake_deepspeed(site: Path) -> None:
    """A real DeepSpeed's traces: its package and its dist-info (DeepSpeed itself is never a dependency)."""
    (site / "deepspeed").mkdir(parents=True)
    (site / "deepspeed" / "__init__.py").write_text("REAL = True\n__version__ = '0.19.8'\n")
    info = site / "deepspeed-0.19.8.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")


def test_beside_a_real_deepspeed_it_refuses_to_work_and_says_why(tmp_path):
    plant_fake_deepspeed(tmp_path / "site")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    run = python("import importlib.metadata as m\nprint(m.version('deepspeed'))\nimport deepspeed", env=env)
    assert run.stdout.strip() == "0.19.8"  # the metadata is the real one's, not an announcement of dstrain
    assert run.returncode != 0 and "a real DeepSpeed is installed" in run.stderr
    assert "pip uninstall dstrain-deepspeed-compat" in run.stderr
    refused = command("deepspeed", "--help", env=env)
    assert refused.returncode != 0 and "a real DeepSpeed is installed" in refused.stderr
    shadowed = python("import warnings; warnings.simplefilter('always')\nimport deepspeed\nprint(deepspeed.__name__)",
                      env={**env, "DSTRAIN_SHADOW_DEEPSPEED": "1"})
    assert shadowed.returncode == 0 and shadowed.stdout.strip() == "dstrain" and "shadowing" in shadowed.stderr


def test_a_folder_named_deepspeed_is_not_deepspeed_and_a_scripts_own_module_is_left_to_it(tmp_path):
    (tmp_path / "deepspeed").mkdir()  # e.g. a project's folder of DeepSpeed configs, in the working directory
    (tmp_path / "deepspeed" / "zero3.json").write_text("{}")
    run = python("import deepspeed; print(deepspeed.__name__)", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "dstrain", run.stderr
    # A deepspeed.py beside the script (no installed metadata) is the script's own, as dstrain's launcher leaves it.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "deepspeed.py").write_text("MINE = True\n")
    run = python("import importlib.metadata as m, importlib.util as u\n"
                 "try:\n    m.version('deepspeed')\nexcept m.PackageNotFoundError:\n    print('no metadata')\n"
                 "import deepspeed; print(deepspeed.MINE)", cwd=mine)
    assert run.returncode == 0 and run.stdout.split() == ["no", "metadata", "True"], run.stderr


def test_it_refuses_to_install_over_a_real_deepspeed(tmp_path):
    # A fresh environment holding a fake DeepSpeed, whose Python also sees this one's packages (pip, setuptools)
    # through a path file, so the build runs offline; pip installs into the fresh one.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True, timeout=120)
    target_python = tmp_path / "env" / "bin" / "python"
    site = Path(subprocess.run([str(target_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    plant_fake_deepspeed(site)
    run = subprocess.run([str(target_python), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                          "--no-cache-dir", str(PROJECT)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert run.returncode != 0
    assert "a real DeepSpeed is installed" in run.stdout + run.stderr and "Nothing was installed" in run.stdout + run.stderr
    assert not list(site.glob("dstrain_deepspeed_compat*")), "the refused package was installed anyway"


def test_pip_installs_reinstalls_and_removes_packages_with_the_hook_in_place(tmp_path):
    # pip refuses any import while it installs and asks for metadata then: the hook must answer without importing.
    name = f"compat_probe_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(f'[build-system]\nrequires = ["setuptools>=77"]\n'
                                             f'build-backend = "setuptools.build_meta"\n'
                                             f'[project]\nname = "{name}"\nversion = "1.0"\n')
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    steps = [[*pip, "install", "--no-deps", "--no-index", "--no-build-isolation", str(tmp_path)],
             [*pip, "install", "--no-deps", "--no-index", "--no-build-isolation", "--force-reinstall", str(tmp_path)],
             [*pip, "uninstall", "-y", name]]
    try:
        for step in steps:
            run = subprocess.run(step, capture_output=True, text=True, timeout=300, cwd=tmp_path)
            assert run.returncode == 0 and "Blocked import" not in run.stderr, run.stderr[-2000:]
    finally:
        subprocess.run([*pip, "uninstall", "-y", name], capture_output=True, timeout=300)
