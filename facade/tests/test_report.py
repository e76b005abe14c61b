"""`dstrain-report`: the JSON fields scripts rely on, the table, and a broken package reported, not raised."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from dstrain.report import LIBRARIES, OPTIONAL_LIBRARIES, collect, render


def run_report(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "dstrain.report", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_every_library_of_the_layering_is_reported():
    noxfile = (Path(__file__).resolve().parents[2] / "noxfile.py").read_text()
    block = noxfile.split("LAYERS: dict[str, set[str]] = {", 1)[1].split("\n}\n", 1)[0]
    layers = re.findall(r'^\s+"(\w+)":', block, re.MULTILINE)
    assert "dstrain" in layers and "dstp" in layers
    assert set(LIBRARIES + OPTIONAL_LIBRARIES) == set(layers), "dstrain-report misses a library of noxfile.LAYERS"


def test_json_fields():
    done = run_report("--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert set(facts) == {"dstrain_libraries", "python", "torch", "packages", "dsaio", "accelerator"}
    libs = facts["dstrain_libraries"]
    assert set(libs) == set(LIBRARIES + OPTIONAL_LIBRARIES)
    for name in LIBRARIES:
        assert libs[name] == {"installed": True, "version": metadata.version(name), "import_error": None}
    assert facts["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["torch"]["version"] == torch.__version__
    assert facts["torch"]["cuda"] == torch.version.cuda
    assert set(facts["packages"]) >= {"torch", "triton", "tensorboard", "wandb", "comet-ml"}
    for pkg in facts["packages"].values():
        assert set(pkg) == {"installed", "version"} and pkg["installed"] == (pkg["version"] is not None)
    backends = facts["dsaio"]["backends"]
    assert list(backends) == ["aio", "io_uring", "threads", "python"]
    assert backends["python"]["available"] is True
    for backend in backends.values():
        assert isinstance(backend["available"], bool) and backend["reason"]
    acc = facts["accelerator"]
    assert set(acc) == {"gpu", "nccl", "gloo", "gds"}
    assert acc["gpu"]["available"] == torch.cuda.is_available()
    for fact in acc.values():
        assert isinstance(fact["available"], bool) and isinstance(fact["reason"], str) and fact["reason"]
    if not torch.cuda.is_available():
        assert not acc["nccl"]["available"] and not acc["gds"]["available"]


def test_table_marks_every_row():
    text = render(collect())
    for name in LIBRARIES:
        assert f"[OK] {name:<20}" in text
    assert f"[OK] {'python':<20} {'works':<18}" in text  # dsaio's pure-Python backend always works
    gpu = "[OK]" if torch.cuda.is_available() else "[NO]"
    assert f"{gpu} {'GPU':<20}" in text
    assert "\033[" not in text  # colour only on a terminal


def test_broken_optional_package_is_reported_not_raised(tmp_path):
    """An installed dspipe whose import fails: the report names the error and still exits 0."""
    (tmp_path / "dspipe").mkdir()
    (tmp_path / "dspipe" / "__init__.py").write_text("raise RuntimeError('half-installed build')\n")
    (tmp_path / "dspipe-0.1.0.dist-info").mkdir()
    (tmp_path / "dspipe-0.1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: dspipe\nVersion: 0.1.0\n")
    done = run_report("--json", pythonpath=str(tmp_path))
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["dstrain_libraries"]["dspipe"] == {"installed": True, "version": "0.1.0",
                                                    "import_error": "RuntimeError: half-installed build"}
    table = render(facts)  # the table is a pure function of the facts
    assert "[NO] dspipe" in table and "import fails: RuntimeError: half-installed build" in table
