"""A DeepSpeed beside the script is the script's, under the launcher too (issue 28, item 5).

The launcher's ranks used to look for a real DeepSpeed before the script's folder was on sys.path, so a
`deepspeed.py` or `deepspeed/` package next to the script was silently replaced by dstrain. Now the check
sees the path as `python script.py` does. A module beside the script named like a library a mapped path
is served by (`dspipe.py` for `deepspeed.pipe`) is refused by name instead of standing in for it.

One test runs the real launcher; the others run its rank wrapper (`_rank.py`, what torchrun starts in each
rank) directly, which is where the check lives, without torchrun's start-up.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_launcher import free_port

from dstrain.launcher.commands import RANK_ENTRY

REPORT = "import deepspeed\nprint('deepspeed from', deepspeed.__file__, flush=True)\n"
RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}


def rank(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **RANK_ENV}
    env.pop("DSTRAIN_DEEPSPEED_ALIAS", None)
    return subprocess.run([sys.executable, RANK_ENTRY, "--no_local_rank", str(script), *args], capture_output=True,
                          text=True, timeout=120, cwd=script.parent.parent, env=env)


def plant(folder: Path, kind: str) -> Path:
    """A DeepSpeed of the user's own beside the script: a module, or a package."""
    if kind == "module":
        (folder / "deepspeed.py").write_text("LOCAL = True\n")
        return folder / "deepspeed.py"
    (folder / "deepspeed").mkdir()
    (folder / "deepspeed" / "__init__.py").write_text("LOCAL = True\n")
    return folder / "deepspeed" / "__init__.py"


def test_a_deepspeed_package_beside_the_script_is_the_scripts_under_the_launcher(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    local = plant(folder, "package")
    (folder / "train.py").write_text(REPORT)
    done = subprocess.run([sys.executable, "-m", "dstrain.launcher", "--num_procs", "1", "--master_port",
                           str(free_port()), str(folder / "train.py")], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"deepspeed from {local}" in done.stdout


@pytest.mark.parametrize("kind", ["module", "package"])
def test_a_deepspeed_beside_the_script_is_not_replaced_by_dstrain(tmp_path, kind):
    folder = tmp_path / "job"
    folder.mkdir()
    local = plant(folder, kind)
    (folder / "train.py").write_text(REPORT)
    done = rank(folder / "train.py")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"deepspeed from {local}"


def test_without_one_the_script_runs_on_dstrain(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(REPORT + "import deepspeed.pipe\nprint(deepspeed.pipe.PipelineModule.__module__)\n")
    done = rank(folder / "train.py")
    assert done.returncode == 0, done.stderr[-3000:]
    import dspipe
    import dstrain

    assert done.stdout.split("\n")[:2] == [f"deepspeed from {dstrain.__file__}", dspipe.PipelineModule.__module__]


@pytest.mark.parametrize("order", ["deepspeed_first", "own_first"])
def test_a_dspipe_beside_a_script_importing_deepspeed_pipe_is_named(tmp_path, order):
    """The user's own dspipe.py would have been imported as dstrain's pipeline library (a confusing failure
    inside dstrain, or, with matching names, the wrong code): the import names the file instead."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "dspipe.py").write_text("PipelineModule = LayerSpec = TiedLayerSpec = DualPipeVModule = object\n")
    lines = ["import deepspeed.pipe", "import dspipe"]
    (folder / "train.py").write_text("\n".join(lines if order == "deepspeed_first" else lines[::-1]) + "\n")
    done = rank(folder / "train.py")
    assert done.returncode != 0
    assert (f"ImportError: deepspeed.pipe is served by dstrain's dspipe library, but {folder / 'dspipe.py'} has the "
            f"same name and would be imported in its place") in done.stderr
    # the same with the one-line import in the script, run by plain `python script.py`
    (folder / "train.py").write_text("import dstrain.as_deepspeed\n" + (folder / "train.py").read_text())
    plain = subprocess.run([sys.executable, str(folder / "train.py")], capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and f"but {folder / 'dspipe.py'} has the same name" in plain.stderr
