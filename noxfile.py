"""Test automation for the dstrain monorepo.

`nox` runs every library's tests, each in a fresh virtual environment that holds only that
library, the sibling libraries it declares (read from the pyproject files) and its test extra, so
a forgotten dependency fails its tests. `nox -s dsconfig` runs one library; `nox -s lint` runs ruff
and the layering check (tools/check_layers.py, which reads LAYERS and BENCH_LAYERS from this file).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = str(ROOT / "constraints.txt")  # pins torch==2.13.0 for every install
# Byte-compiling torch and transformers at install is most of each session's install time; Python compiles
# what a test imports anyway, and only that.
FAST_INSTALL = ("--no-compile",)

# The layering of DESIGN.md as data, lowest first. A library may depend only on those it lists
# here; a new library is one line.
LAYERS: dict[str, set[str]] = {
    "dsaio": set(),
    "dsconfig": set(),
    "dscomm": {"dsconfig"},
    "dsmonitor": {"dsconfig"},
    "dszero": {"dsconfig", "dscomm", "dsaio"},
    "dspipe": {"dsconfig", "dscomm"},
    "dsmoe": {"dsconfig", "dscomm"},
    "dstp": {"dsconfig", "dscomm"},
    "dsdata": {"dsconfig", "dscomm"},
    "dsseq": {"dsconfig", "dscomm"},
    "dscompile": {"dsconfig", "dscomm", "dszero", "dstp"},  # above the middle row (DESIGN.md)
    "dstrain": {"dsconfig", "dscomm", "dsaio", "dsmonitor", "dszero", "dspipe", "dsmoe", "dstp", "dsdata", "dsseq",
                "dscompile"},
}

# What a library's benchmarks (libs/<lib>/bench) may import beyond its LAYERS line: these time what
# users run, through the facade's engine (tools/check_layers.py reads bench/ as well as src/).
BENCH_LAYERS: dict[str, set[str]] = {
    "dszero": {"dstrain"},  # bench_offload_engine.py: offload through initialize(); bench_muon.py: dstrain.ops.Muon
    "dsmoe": {"dstrain"},  # bench_moe_layer.py: the MoE layer through initialize(), beside DeepSpeed's
    "dstp": {"dstrain"},  # bench_tp.py: tensor parallel through initialize()
    "dsseq": {"dstrain"},  # bench_ulysses.py: sp 2 against dp 2 through initialize()
}

# A library tested a second time with another extra: session name -> (library, extra, modules that
# must NOT be importable in that environment).
VARIANTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "dsaio-notorch": ("dsaio", "test-notorch", ("torch",)),  # dsaio is installed alone, without torch
}

# Not a layer: the opt-in package that makes an environment's `deepspeed` dstrain (never in requirements.txt).
COMPAT = ROOT / "deepspeed-compat"

nox.options.sessions = [*LAYERS, *VARIANTS, "dstrain-spine", "gpu-check-dry-run", "deepspeed-compat", "lint"]
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True


def _frugal(session_func):
    """Each session's environment holds its own torch (about 0.8 GB; 2 GB for the facade's): removed when the
    session ends, so a full run needs the disk of one or two sessions, not of all of them (a CI machine ran out
    of disk with every environment kept). torch.compile's cache goes inside the environment too. Keep them with
    DSTRAIN_KEEP_NOX_VENVS=1 (e.g. to rerun one session with `nox -r -s NAME`)."""

    @functools.wraps(session_func)
    def wrapper(session: nox.Session) -> None:
        session.env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(session.env_dir / "inductor-cache"))
        try:
            session_func(session)
        finally:
            if not os.environ.get("DSTRAIN_KEEP_NOX_VENVS") and session.env_dir.is_dir():
                shutil.rmtree(session.env_dir, ignore_errors=True)

    return wrapper


def _project_dir(lib: str) -> Path:
    return ROOT / ("facade" if lib == "dstrain" else f"libs/{lib}")


def _sibling_dependencies(lib: str, optional: bool = True) -> list[str]:
    """Sibling libraries named in `lib`'s [project].dependencies and, with `optional`, its extras (the
    facade's middle-row libraries are extras: they too must resolve to the local checkouts)."""
    project = tomllib.loads((_project_dir(lib) / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    if optional:
        requirements += [req for extra in project.get("optional-dependencies", {}).values() for req in extra]
    names = (re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0] for req in requirements)
    return list(dict.fromkeys(name for name in names if name in LAYERS and name != lib))


def _closure(lib: str, optional: bool = True) -> list[str]:
    """`lib`'s sibling dependencies (with `optional`: and its extras'), transitively, lowest layer first."""
    seen: list[str] = []

    def visit(name: str) -> None:
        for dep in _sibling_dependencies(name, optional):
            if dep not in seen:
                visit(dep)
                seen.append(dep)

    visit(lib)
    return sorted(seen, key=list(LAYERS).index)


def _run_library_tests(session: nox.Session, lib: str, extra: str = "test", absent: tuple[str, ...] = ()) -> None:
    local = [str(_project_dir(dep)) for dep in _closure(lib)]
    # One pip call so sibling requirements resolve to the local checkouts, never to PyPI.
    session.install(*FAST_INSTALL, "-c", CONSTRAINTS, *local, f"{_project_dir(lib)}[{extra}]")
    _check_absent(session, absent)
    # The slowest tests named in every run, so CI time stays visible.
    session.run("pytest", str(_project_dir(lib) / "tests"), "--durations=12", *session.posargs)


def _check_absent(session: nox.Session, modules: tuple[str, ...]) -> None:
    for module in modules:  # the variant is only meaningful if the module really is missing
        session.run("python", "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) "
                                    f"is not None and '{module} is installed but must not be')")


def _library_session(lib: str, extra: str = "test", absent: tuple[str, ...] = ()):
    def session_func(session: nox.Session) -> None:
        _run_library_tests(session, lib, extra, absent)

    session_func.__doc__ = f"Install {lib}[{extra}] alone with its declared closure and run its tests."
    return session_func


for _lib in LAYERS:
    nox.session(name=_lib)(_frugal(_library_session(_lib)))
for _name, (_lib, _extra, _absent) in VARIANTS.items():
    nox.session(name=_name)(_frugal(_library_session(_lib, _extra, _absent)))


@nox.session(name="dstrain-spine")
@_frugal
def dstrain_spine(session: nox.Session) -> None:
    """The facade with its required libraries only (no extras: no dspipe, dsmoe, dstp, dsdata, dsseq, dscompile): it
    trains, and refuses what needs a missing library by name (facade/tests_spine)."""
    spine = _closure("dstrain", optional=False)
    middle_row = tuple(lib for lib in _closure("dstrain") if lib not in spine)
    session.install(*FAST_INSTALL, "-c", CONSTRAINTS, *[str(_project_dir(dep)) for dep in spine], str(_project_dir("dstrain")),
                    "pytest>=8")
    _check_absent(session, middle_row)
    session.log(f"installed {', '.join(spine)} and dstrain; absent: {', '.join(middle_row)}")
    session.run("pytest", "-q", str(ROOT / "facade" / "tests_spine"), *session.posargs, env={"DSTRAIN_SPINE": "1"})


@nox.session(name="gpu-check-dry-run")
@_frugal
def gpu_check_dry_run(session: nox.Session) -> None:
    """tools/gpu_check/run.sh --dry-run: the GPU check's steps on this CPU machine (every library installed with
    pip install --no-deps -e into this session's torch, native cores built, the gpu-marked tests rehearsed on
    the CPU, the benchmarks smoke-run). Only what a GPU machine's image already holds is installed here; torch
    unpacks without byte-compiling, which is most of its install time."""
    session.install(*FAST_INSTALL, "-c", CONSTRAINTS, "torch", "numpy", "attrs", "cattrs", "pytest>=8",
                    "setuptools>=77", "pybind11>=2.12")
    out = Path(session.create_tmp()) / "gpu-check"
    session.run(str(ROOT / "tools" / "gpu_check" / "run.sh"), "--dry-run", "--jobs", "2", str(out), *session.posargs,
                env={"PYTHON": str(Path(session.bin) / "python")}, external=True)


@nox.session(name="deepspeed-compat")
@_frugal
def deepspeed_compat(session: nox.Session) -> None:
    """dstrain-deepspeed-compat over the facade and every library: `import deepspeed`, its metadata and commands,
    and Hugging Face Transformers / Accelerate / DeepSpeed-Chat runs on dstrain (deepspeed-compat/tests)."""
    local = [str(_project_dir(dep)) for dep in _closure("dstrain")]
    session.install(*FAST_INSTALL, "-c", CONSTRAINTS, *local, str(_project_dir("dstrain")), f"{COMPAT}[test]")
    session.run("pytest", str(COMPAT / "tests"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then the layering: declared sibling dependencies and actual imports."""
    session.install("ruff", "pytest")
    session.run("ruff", "check", ".")
    # The import check kept in this repository reads LAYERS above, so it runs on a clean clone; its
    # tests plant bad imports in a scratch repository and expect it to fail.
    session.run("python", str(ROOT / "tools" / "check_layers.py"), str(ROOT))
    session.run("pytest", "-q", str(ROOT / "tools" / "tests"))
    bad = [
        f"{lib} declares {dep}, which is not below it in noxfile.LAYERS"
        for lib in LAYERS
        for dep in _sibling_dependencies(lib)
        if dep not in LAYERS[lib]
    ]
    listed = (ROOT / "requirements.txt").read_text()
    bad += [f"requirements.txt (the quick start's install) does not list {_project_dir(lib).relative_to(ROOT)}"
            for lib in LAYERS if f"./{_project_dir(lib).relative_to(ROOT)}" not in listed]
    if COMPAT.name in listed:
        bad.append(f"requirements.txt installs {COMPAT.name}, which changes `import deepspeed` for the whole "
                   f"environment: it is installed only by choice")
    if bad:
        session.error("\n".join(bad))
    shared_check = ROOT.parent / "shared" / "tools" / "check_layers.py"  # the team's copy, with extra rules
    if shared_check.exists():
        session.run(sys.executable, str(shared_check), str(ROOT), external=True)
    else:
        session.log(f"{shared_check} not found; checked with tools/check_layers.py only")
