"""Nothing of a job outlives the process that supervises it, however that process dies (issue 28, item 2).

Real jobs (torchrun, two gloo ranks that each start a helper in a session of their own) tagged with a
marker in their environment; a supervisor is killed with SIGKILL, which gives it no chance to clean
up, and within a few seconds no process may carry the marker. Before, a killed `dstrain --autotuning
tune` left its running experiment (launcher, node agent, torchrun, ranks, helpers) running for good,
and a killed node agent left the launcher returning at once while the job still ran.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from test_launcher import SCRIPTS, TIMEOUT, Launches, children, orphans, tagged_processes, wait_for_files

GLOO_HANG = str(SCRIPTS / "gloo_hang.py")
SETTLE = 10.0  # "a few seconds": every stop here is a SIGTERM to a process that does not resist it


@pytest.fixture
def launches(tmp_path):
    """Jobs started in tmp_path, tagged; whatever still carries the tag afterwards fails the test (and is killed)."""
    started = Launches(tmp_path)
    yield started
    for proc in started.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = orphans(started.tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def describe(pids: list[int]) -> str:
    return "; ".join(f"{pid}: {command_line(pid)[:150]}" for pid in pids)


def gone_within(tag: str, seconds: float) -> list[int]:
    left = orphans(tag, settle=seconds)
    described = describe(left)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {seconds:.0f} s after the kill: {described}"
    return left


def test_a_killed_tuner_takes_its_running_experiment_down(launches, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "tune.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": [1], "zero_optimization": {"stage": 0},
        "autotuning": {"enabled": True, "results_dir": "results", "exps_dir": "exps"}}))
    tuner = launches.start("--num_procs", "2", "--autotuning", "tune", "--autotuning_timeout", "300", GLOO_HANG,
                      "--deepspeed_config", "tune.json", str(out), port=False)
    wait_for_files(out, ["started.0", "started.1"], tuner, timeout=TIMEOUT)
    assert len(tagged_processes(launches.tag)) >= 8  # tuner, launcher, agent, keeper, torchrun, 2 ranks, 2 helpers
    tuner.kill()
    tuner.communicate(timeout=TIMEOUT)
    gone_within(launches.tag, SETTLE)


@pytest.mark.parametrize("victims", [("agent",), ("keeper",), ("agent", "keeper"), ("torchrun",)])
def test_a_killed_supervisor_in_the_node_takes_the_job_down(launches, tmp_path, victims):
    """SIGKILL the node agent (the launcher's child; on a remote node, ssh's), its keeper, both at once, or
    torchrun: torchrun, both ranks and their helpers, which sit in sessions of their own, all stop, and the
    launcher returns only once they have."""
    launcher = launches.start("--num_procs", "2", GLOO_HANG, str(tmp_path), port=False)  # the default --stop_grace
    wait_for_files(tmp_path, ["started.0", "started.1"], launcher, timeout=TIMEOUT)
    (agent,) = children(launcher.pid)
    (keeper,) = children(agent)
    (torchrun,) = children(keeper)
    pids = {"agent": agent, "keeper": keeper, "torchrun": torchrun}
    killed_at = time.monotonic()
    for name in victims:
        os.kill(pids[name], signal.SIGKILL)
    code = launcher.wait(timeout=TIMEOUT)  # not communicate(): survivors would hold its output open
    left = tagged_processes(launches.tag)
    assert not left, f"the launcher returned ({code}) while these still ran: {describe(left)}"
    assert code != 0
    gone_within(launches.tag, 0.5)
    assert time.monotonic() - killed_at < 30  # the stops are SIGTERMs; nothing waits out a grace period
