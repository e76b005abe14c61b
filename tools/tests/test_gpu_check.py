"""tools/gpu_check: its report (figures against targets, checks from pytest's junit files, the markdown and
JSON), where its gpu tests live, and a run on an interpreter without torch. Standard library and pytest only
(nox's lint session runs it); the full dry run is nox's gpu-check-dry-run session."""

import json
import re
import subprocess
import sys
import textwrap
import time
import venv
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOOL = REPO / "tools" / "gpu_check"
sys.path.insert(0, str(TOOL))

import gpu_check  # noqa: E402
from report import FAILED, PASSED, SKIPPED, Check, Figure, Report, junit_checks, meets  # noqa: E402


def test_targets_read_as_written():
    assert meets(0.7, "<= 0.8") and not meets(0.81, "<= 0.8")
    assert meets(2.0, ">= 2") and not meets(1.99, ">= 2")
    with pytest.raises(ValueError, match="expected '<= number'"):
        meets(1.0, "< 2")


def test_a_measured_figure_knows_whether_it_met_its_target():
    data = {"name": "x", "status": "measured", "value": 9.0, "unit": "ms", "anchor": "torch", "anchor_value": 10.0,
            "ratio": 0.9, "target": "<= 0.8", "runs": 5, "unknown key": 1}
    figure = Figure.from_json(data)
    assert figure.met is False and figure.runs == 5
    assert Figure.from_json({**data, "ratio": 0.5}).met is True
    assert Figure.from_json({"name": "y", "status": "skipped", "reason": "no fio"}).met is None


def test_report_verdict_markdown_and_json(tmp_path):
    report = Report(mode="gpu", started="then", machine={"GPU": "H200 | 141 GiB"})
    report.checks += [Check("a", "g", PASSED), Check("b", "g", SKIPPED, "no GDS here")]
    report.figures.append(Figure("layer", "measured", 8.0, "ms", "torch", 10.0, 0.8, "<= 0.8", True, 7, "python b.py"))
    report.write(tmp_path)
    assert json.loads((tmp_path / "gpu_report.json").read_text())["verdict"] == "incomplete"  # not finished yet
    report.complete = True
    report.write(tmp_path)
    data = json.loads((tmp_path / "gpu_report.json").read_text())
    assert data["verdict"] == "passed" and data["figures"][0]["anchor_value"] == 10.0
    text = (tmp_path / "gpu_report.md").read_text()
    assert "# dstrain GPU check: passed" in text and "H200 \\| 141 GiB" in text
    assert "| layer | 8 ms | torch: 10 ms | 0.8 | <= 0.8 | yes | 7 |" in text
    assert "| skipped | g | b | 0.0 | no GDS here |" in text
    report.checks.append(Check("c", "g", FAILED, "boom"))
    assert report.verdict == "failed"


def test_checks_come_from_pytests_junit_file(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import pytest

        def test_good():
            pass

        def test_bad():
            assert 1 == 2, "one is not two"

        def test_absent():
            pytest.skip("needs a CUDA GPU")
    """))
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                    str(tmp_path / "test_sample.py")], capture_output=True, timeout=120, cwd=tmp_path)
    checks = {c.name: c for c in junit_checks(junit, "sample")}
    assert checks["test_sample::test_good"].status == PASSED
    assert checks["test_sample::test_bad"].status == FAILED and "one is not two" in checks["test_sample::test_bad"].reason
    assert checks["test_sample::test_absent"].status == SKIPPED
    assert checks["test_sample::test_absent"].reason == "needs a CUDA GPU"
    rehearsed = {c.name: c for c in junit_checks(junit, "sample", rehearsal=True)}
    assert rehearsed["test_sample::test_good"].status == SKIPPED
    assert "rehearsed on the CPU: passed" in rehearsed["test_sample::test_good"].reason
    assert rehearsed["test_sample::test_bad"].status == FAILED  # a rehearsal that fails fails the dry run


def test_every_gpu_mark_lives_in_a_file_run_sh_runs():
    """run.sh runs `pytest -m gpu` on the test_gpu_*.py files (collecting every test folder would import
    what the GPU machine may lack): a gpu mark elsewhere would never run, a file without one would run nothing."""
    listed = set(gpu_check.gpu_test_files())
    assert len(listed) >= 6
    marked = {path for pattern in ("libs/*/tests/**/*.py", "facade/tests/**/*.py") for path in REPO.glob(pattern)
              if re.search(r"mark\.gpu\b", path.read_text())}
    assert marked == listed


def test_dry_run_on_an_interpreter_without_torch_says_so_and_stops(tmp_path):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    out = tmp_path / "out"
    done = subprocess.run([str(TOOL / "run.sh"), "--dry-run", str(out)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(bare / "bin" / "python")})
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((out / "gpu_report.json").read_text())
    assert report["verdict"] == "failed" and report["mode"] == "dry-run"
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["Python modules the libraries and tests need"]["status"] == FAILED
    assert "torch" in checks["Python modules the libraries and tests need"]["reason"]
    for step in ("install", "gpu tests", "benchmarks"):
        assert checks[step]["status"] == SKIPPED and "has no torch" in checks[step]["reason"]
    assert (out / "gpu_report.md").read_text().startswith("# dstrain GPU check: failed")


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["out", "--jobs", "0"])
    assert gpu_check.parse_args(["out"]).seconds == gpu_check.TOTAL_SECONDS
    assert gpu_check.parse_args(["out", "--dry-run"]).seconds == gpu_check.DRY_RUN_SECONDS


def test_a_command_past_its_time_is_stopped_with_what_it_started(tmp_path):
    run = gpu_check.Run(tmp_path / "out", dry_run=True, jobs=1, io_dir=tmp_path, wheels=None, require_targets=False,
                        seconds=60)
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    code, output = run.command("hangs", ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], 1.5)
    assert code == 124 and "stopped after" in output and time.monotonic() - started < 30
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running(grandchild):
        time.sleep(0.1)
    assert not running(grandchild), "the command's own child outlived its timeout"
    assert "===== hangs" in (tmp_path / "out" / "gpu_check.log").read_text()


def running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
