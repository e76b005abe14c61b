"""One experiment: a real short run of the user's script through the launcher, at one point.

The point's config goes to exps_dir/<name>.json (the experiment's description, as DeepSpeed writes
it) and results_dir/<name>/ds_config.json; the launcher runs the script with it and with
DSTRAIN_AUTOTUNING_METRICS naming results_dir/<name>/metrics.json, which the engine writes after
autotuning.end_profile_step and then ends the run (engine_metrics.py). The launcher's output goes to
stdout.log / stderr.log beside it, the command to cmd.txt, and the outcome to exp.json. A failed run
(out of memory, a crash, a timeout, no metrics) is an outcome like any other: recorded, never raised.
With autotuning.overwrite false, an experiment whose exp.json holds an outcome for the same config and
the same command (script, its arguments, the job's size) is not run again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import dsconfig

from .configs import experiment_config
from .engine_metrics import METRICS_ENV
from .errors import AutotuningError
from .outputs import write_atomically
from .search import Outcome
from .space import Point

OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|cannot allocate memory|"
                           r"not enough memory|std::bad_alloc", re.IGNORECASE)
KILLED = re.compile(r"SIGKILL|Signal 9\b|exitcode\s*:\s*-9\b")
# An exception's last line, after the tags torchrun ("[rank0]: ") and the launcher ("[node1 host] ") put before it.
ERROR_LINE = re.compile(r"^(?:\s*\[[^\]]*\]:?)*\s*((?:[\w.]*)(?:Error|Exception|Interrupt|Exit)\b.*)$")
NOT_THE_CAUSE = ("ChildFailedError", "torch.distributed.elastic", "SystemExit")
STDERR_TAIL = 64 * 1024
RESULT_FILES = ("ds_config.json", "cmd.txt", "exp.json", "metrics.json", "stdout.log", "stderr.log")


def prepare_dir(path: Path, what: str) -> Path:
    """`path` as a directory, created if needed; a file in its place is an error naming the key, and so is a
    directory that cannot be created or written (a ConfigError before any experiment runs, not a traceback)."""
    if path.exists() and not path.is_dir():
        raise AutotuningError(f"autotuning.{what} = {str(path)!r} is a file; name a directory (it is created)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # what access() cannot tell: read-only mounts, root on procfs
            pass
    except OSError as exc:
        raise dsconfig.ConfigError(dsconfig.Problem(
            f"autotuning.{what}", f"cannot be created or written ({exc.strerror or exc}); name a directory this "
                                  f"user can write (it is created)", str(path))) from None
    return path


def classify(returncode: int | None, stderr_tail: str, metrics: Mapping[str, Any] | None, metric: str,
             end_step: int, timed_out: float | None = None) -> tuple[str, str]:
    """(status, reason) of a finished run."""
    if timed_out is not None:
        return "timeout", f"did not finish within {timed_out:.0f} s (--autotuning_timeout); stopped"
    if returncode == 0:
        if metrics is None:
            return "no-metrics", (f"the script ended before step {end_step} (autotuning.end_profile_step) was "
                                  f"measured: let it train more steps, or lower the profile steps")
        value = metrics.get(metric)
        if not isinstance(value, (int, float)) or value <= 0:
            why = metrics.get(f"{metric}_error") or "not measured"
            return "no-metrics", f"{metric}: {why}"
        return "ok", ""
    cause = _error_line(stderr_tail)
    if OUT_OF_MEMORY.search(stderr_tail):
        return "oom", cause or "out of memory"
    if KILLED.search(stderr_tail):
        return "oom", "a process was killed by SIGKILL (most likely the kernel's out-of-memory killer)"
    return "crash", cause or f"exit code {returncode}"


ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*-?\d+.*?\((SIG[A-Z]+)\)", re.DOTALL)


def _error_line(text: str) -> str:
    """The exception a rank died of, or the signal torchrun names as the root cause."""
    for line in reversed(text.splitlines()):
        match = ERROR_LINE.match(line)
        if match and not any(word in line for word in NOT_THE_CAUSE):
            return match.group(1).strip()[:300]
    root = ROOT_CAUSE.search(text)
    if root:
        return f"rank {root.group(1)} was ended by {root.group(2)}"
    return ""


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the launcher's process group (the launcher stops its nodes), SIGKILL after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class ExperimentRunner:
    """Callable: point -> Outcome, for the search."""

    def __init__(self, raw: Mapping[str, Any], *, metric: str, end_step: int, exps_dir: Path, results_dir: Path,
                 command: Callable[[str, Mapping[str, Any]], list[str]], description: Mapping[str, Any],
                 overwrite: bool = False, timeout: float = 1800.0, grace: float = 25.0, cwd: str | None = None,
                 display: Callable[[list[str]], str] = shlex.join) -> None:
        self.raw = raw
        self.metric = metric
        self.end_step = end_step
        self.exps_dir = prepare_dir(exps_dir, "exps_dir")
        self.results_dir = prepare_dir(results_dir, "results_dir")
        self.command = command
        self.description = dict(description)  # num_gpus, num_nodes, world_size: the job every point runs on
        self.overwrite = overwrite
        self.timeout = timeout
        self.grace = grace
        self.cwd = cwd or os.getcwd()
        self.display = display

    def __call__(self, point: Point) -> Outcome:
        config = experiment_config(self.raw, point)
        folder = self.results_dir / point.name
        config_path = (folder / "ds_config.json").resolve()
        argv = self.command(str(config_path), config)
        exp = {"name": point.name, "ds_config": config, **self.description, "command": self.display(argv),
               "result_dir": str(folder)}
        _write_json(self.exps_dir / f"{point.name}.json", exp)
        if not self.overwrite:
            earlier = _read_json(folder / "exp.json")
            same = earlier and earlier.get("ds_config") == config and earlier.get("command") == exp["command"]
            if same and earlier.get("status") in ("ok", "oom", "crash", "timeout", "no-metrics"):
                return Outcome(earlier["status"], earlier.get("metrics") or {}, earlier.get("reason", ""),
                               float(earlier.get("seconds", 0.0)), reused=True)
        folder.mkdir(parents=True, exist_ok=True)
        for name in RESULT_FILES:
            (folder / name).unlink(missing_ok=True)
        _write_json(config_path, config)
        (folder / "cmd.txt").write_text(self.display(argv) + "\n")
        outcome = self._launch(argv, folder)
        _write_json(folder / "exp.json", {**exp, "status": outcome.status, "reason": outcome.reason,
                                          "seconds": round(outcome.seconds, 3), "metrics": outcome.metrics})
        return outcome

    def _launch(self, argv: list[str], folder: Path) -> Outcome:
        metrics_path = (folder / "metrics.json").resolve()
        env = {**os.environ, METRICS_ENV: str(metrics_path)}
        began = time.monotonic()
        timed_out = None
        with open(folder / "stdout.log", "wb") as out, open(folder / "stderr.log", "wb") as err:
            # A session of its own: a timeout (or Ctrl-C here) stops the launcher and, through it, every rank.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=self.cwd,
                                    start_new_session=True)
            try:
                proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                timed_out = self.timeout
                _stop(proc, self.grace)
            except BaseException:
                _stop(proc, self.grace)
                raise
        seconds = time.monotonic() - began
        metrics = _read_json(metrics_path)
        status, reason = classify(proc.returncode, _tail(folder / "stderr.log"), metrics, self.metric,
                                  self.end_step, timed_out)
        return Outcome(status, metrics or {}, reason, seconds)


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(path.stat().st_size - STDERR_TAIL, 0))
        return f.read().decode("utf-8", "replace")


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
