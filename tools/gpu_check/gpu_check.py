"""The driver of tools/gpu_check/run.sh: install the libraries into this Python's torch, run every
gpu-marked test, then the benchmark set, and write gpu_report.md / gpu_report.json (and gpu_check.log, the
commands' output) into the folder given. See README.md beside this file.

Plain Python: it runs before anything of ours is installed, with the interpreter that holds the machine's
torch (every command it starts uses the same one). Every step has a time budget inside one deadline, and the
report is rewritten after each step, so a run cut short still leaves what it learned.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import FAILED, PASSED, SKIPPED, Check, Figure, Report, junit_checks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOTAL_SECONDS = 450  # run.sh's hard stop is 470 s; the limit on one H200 is 8 minutes
DRY_RUN_SECONDS = 1500  # a CPU machine (CI's) may be shared and slow: the dry run is bound by nothing else
REQUIRED_MODULES = ("torch", "numpy", "attrs", "cattrs", "pytest", "setuptools", "pybind11")
# Libraries with a C++ core: the variable that makes a failed build fatal, and the module the build makes.
NATIVE = {"dsaio": ("DSAIO_REQUIRE_NATIVE", "dsaio._native"), "dszero": ("DSZERO_REQUIRE_NATIVE", "dszero._cpu_adam")}
TEST_FILE_SECONDS = 240
# name, script, seconds at most, extra arguments (formatted with the run's options)
BENCHES = (
    ("transformer layer", "bench_transformer.py", 60, ()),
    ("ZeRO++ quantizers", "bench_quantize.py", 45, ()),
    ("AutoEP grouped GEMM", "bench_grouped_gemm.py", 75, ()),
    ("dsaio pinned I/O", "bench_dsaio.py", 75, ("--dir", "{io_dir}")),
    ("example GPT ZeRO-3 step", "bench_zero3_gpt.py", 75, ()),
)
_CLEAN_ENV = ("TRITON_INTERPRET", "DSTRAIN_KERNELS", "DSZERO_QUANT_KERNELS", "DS_ACCELERATOR", "DSTRAIN_GPU_REHEARSAL",
              "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def project_dirs() -> list[Path]:
    """Every library of this checkout (each folder with a pyproject.toml) and the facade."""
    return [*sorted(p.parent for p in ROOT.glob("libs/*/pyproject.toml")), ROOT / "facade"]


def gpu_test_files() -> list[Path]:
    """The files holding gpu-marked tests (tools/tests checks no gpu mark lives anywhere else)."""
    return sorted(ROOT.glob("libs/*/tests/test_gpu_*.py")) + sorted(ROOT.glob("facade/tests/test_gpu_*.py"))


class Run:
    def __init__(self, out: Path, dry_run: bool, jobs: int, io_dir: Path, wheels: Path | None,
                 require_targets: bool, seconds: float):
        self.out, self.dry_run, self.jobs, self.io_dir, self.wheels = out, dry_run, jobs, io_dir, wheels
        self.require_targets = require_targets
        self.seconds, self.deadline = seconds, time.monotonic() + seconds
        self.report = Report(mode="dry-run" if dry_run else "gpu", started=now())
        self.stopped = ""  # set when nothing after the current step can run (no torch, say): the reason
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.log = out / "gpu_check.log"
        out.mkdir(parents=True, exist_ok=True)
        self.log.write_text(f"dstrain GPU check, {self.report.mode}, started {self.report.started}\n")
        self.env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
        self.env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONUNBUFFERED="1")
        if dry_run:  # a true rehearsal even on a machine with a GPU: torch sees none
            self.env.update(CUDA_VISIBLE_DEVICES="", DSTRAIN_GPU_REHEARSAL="1")

    # ------------------------------------------------------------------ plumbing
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def note(self, text: str) -> None:
        with self.log.open("a") as log:
            log.write(text if text.endswith("\n") else text + "\n")
        print(text.rstrip("\n"), flush=True)

    def command(self, title: str, cmd: list[str], seconds: float, env: dict | None = None,
                cwd: Path = ROOT) -> tuple[int, str]:
        """Run `cmd` with a timeout; its output goes to the log. Returns (exit code, output); 124 on timeout."""
        seconds = max(1.0, min(seconds, self.left()))
        started = time.monotonic()
        # A session of its own, so a timeout ends what the command started too (pytest's training
        # subprocesses, say), not the command alone.
        child = subprocess.Popen(cmd, cwd=cwd, env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            output, _ = child.communicate(timeout=seconds)
            code = child.returncode
        except subprocess.TimeoutExpired:
            _kill_group(child)
            output, _ = child.communicate()
            code = 124
            output = (output or "") + f"\n(stopped after {seconds:.0f} s)\n"
        except BaseException:
            _kill_group(child)
            raise
        self.note(f"\n===== {title} ({time.monotonic() - started:.1f} s, exit {code}) =====\n"
                  f"$ {shlex.join(cmd)}\n{output}")
        return code, output

    def step(self, name: str, action: Callable[[], None], minimum: float = 5.0) -> None:
        started = time.monotonic()
        if self.stopped:
            self.report.checks.append(Check(name, "not run", SKIPPED, self.stopped))
            status = SKIPPED
        elif self.left() < minimum:
            self.report.checks.append(Check(name, "budget", SKIPPED, f"no time left ({self.left():.0f} s of the "
                                                                      f"{self.seconds:.0f} s budget; needs {minimum:.0f})"))
            status = SKIPPED
        else:
            try:
                action()
                status = PASSED
            except Exception as exc:  # a bug of the driver itself: recorded, and the next step still runs
                self.report.checks.append(Check(name, "driver", FAILED, f"{type(exc).__name__}: {exc}"))
                status = FAILED
        self.report.steps.append({"name": name, "status": status, "seconds": round(time.monotonic() - started, 1),
                                  "log": self.log.name})
        self.report.write(self.out)

    def add(self, group: str, name: str, ok: bool, reason: str = "", seconds: float = 0.0) -> bool:
        self.report.checks.append(Check(name, group, PASSED if ok else FAILED, "" if ok else reason, seconds))
        return ok

    # ------------------------------------------------------------------ steps
    def preflight(self) -> None:
        probe = ("import importlib.util, json, os, platform, sys\n"
                 f"info = {{'python': platform.python_version(), 'executable': sys.executable, "
                 f"'cpus': os.cpu_count(), 'missing': [m for m in {REQUIRED_MODULES!r} "
                 f"if importlib.util.find_spec(m) is None]}}\n"
                 "try:\n    import torch\nexcept Exception as exc:\n    info['torch'] = f'not importable: {exc}'\n"
                 "else:\n    info['torch'] = torch.__version__\n    info['torch CUDA'] = torch.version.cuda\n"
                 "    info['CUDA available'] = torch.cuda.is_available()\n"
                 "    if torch.cuda.is_available():\n        p = torch.cuda.get_device_properties(0)\n"
                 "        info['GPU'] = f'{p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability '"
                 " f'{p.major}.{p.minor}, {torch.cuda.device_count()} device(s)'\n"
                 "try:\n    import triton\n    info['triton'] = triton.__version__\n"
                 "except Exception as exc:\n    info['triton'] = f'not importable: {exc}'\n"
                 "print(json.dumps(info))\n")
        code, output = self.command("machine", [sys.executable, "-c", probe], 90)
        info = _last_json(output) if code == 0 else None
        if info is None:
            self.add("preflight", "the machine's Python and torch answer", False, _tail(output))
            return
        missing = info.pop("missing")
        if missing and self.wheels is not None:
            missing = self.install_wheels(missing)
        if "torch" in missing:
            self.stopped = (f"{sys.executable} has no torch: run with PYTHON set to the interpreter that holds the "
                            "machine's PyTorch")
        smi_code, smi = self.command("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                                    "--format=csv,noheader"], 20) if _which("nvidia-smi") else (1, "")
        info["nvidia-smi"] = smi.strip().splitlines()[0] if smi_code == 0 and smi.strip() else "not available"
        info["mode"] = self.report.mode
        self.report.machine = info
        self.add("preflight", "Python modules the libraries and tests need", not missing,
                 f"missing: {', '.join(missing)}; carry their wheels (README.md: 'What it needs') and pass --wheels")
        if self.dry_run:
            self.report.checks.append(Check("torch sees a CUDA GPU", "preflight", SKIPPED,
                                            "dry run: CUDA hidden (CUDA_VISIBLE_DEVICES=)"))
        else:
            self.add("preflight", "torch sees a CUDA GPU", info.get("CUDA available") is True,
                     f"torch {info.get('torch')} (CUDA {info.get('torch CUDA')}) sees no GPU; nvidia-smi: "
                     f"{info['nvidia-smi']}")
            self.add("preflight", "triton is installed (the Triton kernels need it)",
                     not str(info.get("triton", "")).startswith("not"), str(info.get("triton")))

    def install_wheels(self, missing: list[str]) -> list[str]:
        """pip-installs the carried wheels of the missing distributions; returns what is still missing."""
        wheels = [w for w in sorted(self.wheels.glob("*.whl"))
                  if _normal(w.name.split("-")[0]) in {_normal(m) for m in missing}]
        if wheels:
            self.command("install carried wheels", [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                                                    *map(str, wheels)], 120)
        probe = (f"import importlib.util, json; "
                 f"print(json.dumps([m for m in {missing!r} if importlib.util.find_spec(m) is None]))")
        code, output = self.command("still missing", [sys.executable, "-c", probe], 60)
        return json.loads(output.strip().splitlines()[-1]) if code == 0 else missing

    def install(self) -> None:
        """pip install --no-deps -e of every library into this Python, the native cores built here."""
        env = dict(self.env, **{var: "1" for var, _ in NATIVE.values()})
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        native = [d for d in project_dirs() if d.name in NATIVE]
        plain = [d for d in project_dirs() if d.name not in NATIVE]
        # The two C++ builds and the pure-Python installs run side by side: each build compiles on one core.
        groups = [[d] for d in native] + [plain]
        with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
            started = time.monotonic()
            results = list(pool.map(lambda group: self.command(
                f"pip install -e {' '.join(d.name for d in group)}",
                [*cmd, *(arg for d in group for arg in ("-e", str(d)))], 240, env), groups))
        for group, (code, output) in zip(groups, results):
            for d in group:
                self.add("install", f"pip install --no-deps -e {d.relative_to(ROOT)}", code == 0, _tail(output),
                         time.monotonic() - started)
        # Where each library resolves (found, not imported: dstp's greenlet, say, is no concern of this check);
        # the native cores are imported, which loads them.
        names = [_import_name(d) for d in project_dirs()]
        probe = ("import importlib, importlib.util, json\nfound = {}\n"
                 f"for name in {names!r}:\n"
                 "    spec = importlib.util.find_spec(name)\n"
                 "    found[name] = spec.origin if spec is not None else 'not found'\n"
                 f"for name in {[module for _, module in NATIVE.values()]!r}:\n"
                 "    try:\n        found[name] = importlib.import_module(name).__file__\n"
                 "    except Exception as exc:\n        found[name] = f'ERROR {type(exc).__name__}: {exc}'\n"
                 "print(json.dumps(found))\n")
        code, output = self.command("where the libraries resolve", [sys.executable, "-c", probe], 120)
        found = _last_json(output) or {}
        for name in names:
            where = found.get(name, "not reported")
            self.add("install", f"{name} resolves to this checkout", str(where).startswith(str(ROOT)),
                     f"it resolves to {where}, not into {ROOT}")
        for lib, (_, module) in NATIVE.items():
            where = str(found.get(module, "not reported"))
            self.add("install", f"{lib}'s native core built and loads ({module})", not where.startswith(("ERROR", "not")),
                     where)

    def tests(self) -> None:
        """On a GPU one pytest per file, --jobs at a time (each with its own timeout, a crash or a hang costs
        one file); in the dry run one pytest for all, as importing torch is most of a small CPU's time."""
        files = gpu_test_files()
        if self.dry_run:
            batches = [files]
            timeout = max(30.0, min(3 * TEST_FILE_SECONDS, self.left()))
        else:
            batches = [[path] for path in files]
            timeout = max(30.0, min(TEST_FILE_SECONDS, self.left() - 150))  # 150 s: the benchmarks' share

        def one(paths: list[Path]) -> list[Check]:
            group = str(paths[0].relative_to(ROOT)) if len(paths) == 1 else "gpu tests"
            junit = self.scratch / (f"{paths[0].parent.parent.name}-{paths[0].stem}.xml" if len(paths) == 1
                                    else "all.xml")
            code, output = self.command(f"pytest -m gpu {group}", [
                sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                *map(str, paths)], timeout)
            checks = junit_checks(junit, rehearsal=self.dry_run) if junit.exists() else []
            if code == 124:
                checks.append(Check("the file's tests finished in time", group, FAILED,
                                    f"stopped after {timeout:.0f} s: {_tail(output, 2)}"))
            elif code == 5:
                checks.append(Check("holds gpu-marked tests", group, FAILED, "pytest -m gpu collected no test"))
            elif code not in (0, 1) or not checks:
                checks.append(Check("pytest ran", group, FAILED, f"exit {code}: {_tail(output)}"))
            return checks

        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            for checks in pool.map(one, batches):
                self.report.checks.extend(checks)

    def benchmarks(self) -> None:
        if self.dry_run:  # smoke runs on the CPU, side by side: they check the scripts, they measure nothing
            with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
                list(pool.map(lambda bench: self.benchmark(*bench), BENCHES))
        else:
            for bench in BENCHES:  # one at a time: each has the GPU to itself
                if self.left() < 20:
                    self.report.figures.append(Figure(bench[0], "skipped", reason="no time left in the budget"))
                    self.report.checks.append(Check(f"benchmark: {bench[0]}", "benchmarks", SKIPPED,
                                                    "no time left in the budget"))
                    continue
                self.benchmark(*bench)

    def benchmark(self, name: str, script: str, seconds: float, extra: tuple[str, ...]) -> None:
        path = HERE / "benches" / script
        result = self.scratch / f"{path.stem}.json"
        args = [a.format(io_dir=self.io_dir) for a in extra]
        cmd = [sys.executable, str(path), "--json", str(result), *args, *(["--smoke"] if self.dry_run else [])]
        started = time.monotonic()
        code, output = self.command(f"benchmark: {name}", cmd, seconds if not self.dry_run else 300)
        figures = [Figure.from_json(f) for f in json.loads(result.read_text())["figures"]] if result.exists() else []
        elapsed = time.monotonic() - started
        shown = shlex.join(["python", str(path.relative_to(ROOT)), *args])
        if code != 0 or not figures:
            why = f"exit {code}: {_tail(output)}" if code else "it wrote no figure"
            self.report.checks.append(Check(f"benchmark: {name}", "benchmarks", FAILED,
                                            ("smoke run on the CPU failed: " if self.dry_run else "") + why, elapsed))
            self.report.figures.append(Figure(name, "failed", reason=why, command=shown))
            return
        if self.dry_run:
            self.report.checks.append(Check(f"benchmark: {name}", "benchmarks", SKIPPED,
                                            "no CUDA GPU here; smoke run on the CPU: ok", elapsed))
            self.report.figures += [Figure(f.name, "skipped", unit=f.unit, anchor=f.anchor, target=f.target,
                                           command=shown, reason="dry run: nothing measured") for f in figures]
            return
        for figure in figures:
            figure.command = figure.command or shown
            self.report.figures.append(figure)
            ok = figure.status != "failed"
            self.report.checks.append(Check(f"benchmark: {figure.name}", "benchmarks", PASSED if ok else FAILED,
                                            figure.reason if not ok else "", elapsed))
            if self.require_targets and figure.status == "measured" and figure.met is False:
                self.report.checks.append(Check(f"target: {figure.name}", "targets", FAILED,
                                                f"ratio {figure.ratio:.3g}, target {figure.target}"))

    def finish(self) -> int:
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.report.finished = now()
        self.report.complete = True
        self.report.write(self.out)
        failed = self.report.failed
        self.note(f"\n{self.report.verdict}: {len(failed)} failed check(s); report in {self.out}")
        for check in failed:
            self.note(f"  FAILED [{check.group}] {check.name}: {check.reason}")
        return 1 if failed else 0


def _kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def _tail(output: str, lines: int = 4) -> str:
    kept = [line for line in output.strip().splitlines() if line.strip()][-lines:]
    return " / ".join(line.strip() for line in kept)


def _last_json(output: str) -> dict | None:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _which(program: str) -> bool:
    return any(os.access(Path(d) / program, os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _import_name(project: Path) -> str:
    return "dstrain" if project.name == "facade" else project.name


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tools/gpu_check/run.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for gpu_report.md, gpu_report.json and gpu_check.log")
    parser.add_argument("--dry-run", action="store_true", help="on a CPU machine: the same steps, the CUDA ones "
                        "skipped with the reason, the GPU tests rehearsed on the CPU, the benchmarks smoke-run")
    parser.add_argument("--jobs", type=int, default=3, help="test files run side by side (default 3)")
    parser.add_argument("--io-dir", type=Path, default=None,
                        help="a folder on the disk the dsaio benchmark measures (default: one under the output "
                             "folder)")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="a folder of wheels for Python modules this machine lacks (default: tools/gpu_check/"
                             "wheels when it exists)")
    parser.add_argument("--require-targets", action="store_true",
                        help="a figure that misses its target fails the run (by default it is reported only)")
    parser.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = DRY_RUN_SECONDS if args.dry_run else TOTAL_SECONDS
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.wheels is None and (HERE / "wheels").is_dir():
        args.wheels = HERE / "wheels"
    if args.wheels is not None and not args.wheels.is_dir():
        parser.error(f"--wheels {args.wheels}: not a folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out.resolve()
    io_dir = (args.io_dir or out / "io").resolve()
    run = Run(out, args.dry_run, args.jobs, io_dir, args.wheels, args.require_targets, args.seconds)
    run.step("preflight", run.preflight, minimum=0)
    run.step("install", run.install, minimum=30)
    run.step("gpu tests", run.tests, minimum=30)
    run.step("benchmarks", run.benchmarks, minimum=20)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
