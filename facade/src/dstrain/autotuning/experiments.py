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
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..launcher import dies_with_parent
from .configs import experiment_config
from .engine_metrics import METRICS_ENV
from .owned_dirs import OwnedDir
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


def prepare_dir(path: Path, what: str) -> OwnedDir:
    """autotuning.<what> as a folder of the autotuner (owned_dirs.py): made where missing, taken up where an
    earlier session made it; a link, a file, another's folder or one that cannot be written is a ConfigError
    naming the key."""
    return OwnedDir.prepare(path, what)


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
        self.exps = prepare_dir(exps_dir, "exps_dir")
        self.results = prepare_dir(results_dir, "results_dir")
        self.exps_dir, self.results_dir = exps_dir, results_dir
        self.command = command
        self.description = dict(description)  # num_gpus, num_nodes, world_size: the job every point runs on
        self.overwrite = overwrite
        self.timeout = timeout
        self.grace = grace
        self.cwd = cwd or os.getcwd()
        self.display = display

    def __call__(self, point: Point) -> Outcome:
        config = experiment_config(self.raw, point)
        folder = self.results.folder(point.name)  # made by the tuner, or refused naming what is there
        try:
            return self._run(point, config, folder)
        finally:
            folder.close()

    def _run(self, point: Point, config: dict, folder: OwnedDir) -> Outcome:
        config_path = os.path.join(os.path.abspath(folder.path), "ds_config.json")
        argv = self.command(config_path, config)
        exp = {"name": point.name, "ds_config": config, **self.description, "command": self.display(argv),
               "result_dir": str(folder.path)}
        _write_json(self.exps, f"{point.name}.json", exp)
        if not self.overwrite:
            earlier = _read_json(folder, "exp.json")
            same = earlier and earlier.get("ds_config") == config and earlier.get("command") == exp["command"]
            if same and earlier.get("status") in ("ok", "oom", "crash", "timeout", "no-metrics"):
                return Outcome(earlier["status"], earlier.get("metrics") or {}, earlier.get("reason", ""),
                               float(earlier.get("seconds", 0.0)), reused=True)
        for name in RESULT_FILES:
            folder.remove(name)
        _write_json(folder, "ds_config.json", config)
        folder.write_text("cmd.txt", self.display(argv) + "\n")
        outcome = self._launch(argv, folder)
        _write_json(folder, "exp.json", {**exp, "status": outcome.status, "reason": outcome.reason,
                                         "seconds": round(outcome.seconds, 3), "metrics": outcome.metrics})
        return outcome

    def _launch(self, argv: list[str], folder: OwnedDir) -> Outcome:
        metrics_path = os.path.join(os.path.abspath(folder.path), "metrics.json")
        env = {**os.environ, METRICS_ENV: metrics_path}
        began = time.monotonic()
        timed_out = None
        with folder.create("stdout.log") as out, folder.create("stderr.log") as err:
            # A session of its own: a timeout (or Ctrl-C here) stops the launcher and, through it, every rank.
            # Its parent-death signal stops it (and so the experiment) when this process dies, even by SIGKILL.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=self.cwd,
                                    start_new_session=True, preexec_fn=dies_with_parent(signal.SIGTERM))
            try:
                proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                timed_out = self.timeout
                _stop(proc, self.grace)
            except BaseException:
                _stop(proc, self.grace)
                raise
        seconds = time.monotonic() - began
        metrics = _read_json(folder, "metrics.json")
        tail = (folder.read_bytes("stderr.log", tail=STDERR_TAIL) or b"").decode("utf-8", "replace")
        status, reason = classify(proc.returncode, tail, metrics, self.metric, self.end_step, timed_out)
        return Outcome(status, metrics or {}, reason, seconds)


def _read_json(folder: OwnedDir, name: str) -> dict | None:
    text = folder.read_bytes(name)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _write_json(folder: OwnedDir, name: str, data: Any) -> None:
    folder.write_text(name, json.dumps(data, indent=2, sort_keys=True) + "\n")
