"""`dstrain-report` (DeepSpeed's `ds_report`): what is installed and what works on this machine.

    dstrain-report          aligned table with [OK] / [NO] markers
    dstrain-report --json   the same facts for scripts (`collect()` returns them as a dict)

Every probe is isolated: a package that is missing or fails to import is reported with its error
string, never raised.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

LIBRARIES = ("dsconfig", "dscomm", "dsaio", "dsmonitor", "dszero", "dstrain")


def _optional_libraries() -> tuple[str, ...]:
    """The dstrain libraries the facade's extras name (dspipe, dsmoe, dstp, dsdata, ...), read from its own
    metadata, so a library added as an extra is reported without a second list to keep."""
    try:
        requirements = metadata.requires("dstrain") or []
    except metadata.PackageNotFoundError:
        requirements = []
    names = (re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0] for req in requirements if "extra ==" in req)
    return tuple(dict.fromkeys(name for name in names if name.startswith("ds") and name not in LIBRARIES))


OPTIONAL_LIBRARIES = _optional_libraries()
PACKAGES = {"torch": "torch", "triton": "triton", "tensorboard": "tensorboard", "wandb": "wandb",
            "comet-ml": "comet_ml", "numpy": "numpy"}  # distribution name -> import name


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _guard(probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return probe()
    except Exception as exc:  # a broken optional package must not stop the report
        return {"available": False, "reason": _error(exc)}


def _distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_info(name: str) -> dict[str, Any]:
    """{installed, version, import_error} of one dstrain library (imported, to catch broken installs)."""
    version = _distribution_version(name)
    if version is None:
        return {"installed": False, "version": None, "import_error": None}
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        return {"installed": True, "version": version, "import_error": _error(exc)}
    return {"installed": True, "version": getattr(module, "__version__", version), "import_error": None}


def package_info(dist: str) -> dict[str, Any]:
    """Installed version from package metadata; optional packages are not imported (wandb takes seconds)."""
    version = _distribution_version(dist)
    return {"installed": version is not None, "version": version}


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"available": False, "reason": _error(exc), "version": None, "cuda": None}
    return {"available": True, "version": torch.__version__, "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None), "path": os.path.dirname(torch.__file__)}


def gpu_info() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        why = ("torch is a CPU-only build" if torch.version.cuda is None and not getattr(torch.version, "hip", None)
               else "torch.cuda.is_available() is False (no GPU or driver visible)")
        return {"available": False, "reason": why, "count": 0, "devices": []}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"available": True, "reason": f"{len(names)} device(s)", "count": len(names), "devices": names}


def nccl_info() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return {"available": False, "reason": "this torch build has no NCCL backend", "version": None}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch has NCCL but no GPU is visible", "version": None}
    version = torch.cuda.nccl.version()
    version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {"available": True, "reason": f"NCCL {version}", "version": version}


def gloo_info() -> dict[str, Any]:
    import torch.distributed as dist

    ok = dist.is_available() and dist.is_gloo_available()
    return {"available": ok, "reason": "CPU collectives" if ok else "this torch build has no gloo backend"}


def gds_info() -> dict[str, Any]:
    from dsaio.gds import gds_missing

    missing = gds_missing()
    return {"available": not missing, "reason": "; ".join(missing) if missing else "cuFile and nvidia-fs found",
            "missing": missing}


def aio_backends() -> dict[str, Any]:
    import dsaio

    return {"available": True, "backends": dsaio.backends()}


def collect() -> dict[str, Any]:
    """Every fact the report shows, as plain JSON-ready data."""
    libraries = {name: library_info(name) for name in LIBRARIES + OPTIONAL_LIBRARIES}
    torch = torch_info()
    has_torch = torch["available"]
    no_torch = {"available": False, "reason": f"torch does not import ({torch.get('reason')})"}
    return {
        "dstrain_libraries": libraries,
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "torch": torch,
        "packages": {dist: package_info(dist) for dist in PACKAGES},
        "dsaio": _guard(aio_backends),
        "accelerator": {
            "gpu": _guard(gpu_info) if has_torch else no_torch,
            "nccl": _guard(nccl_info) if has_torch else no_torch,
            "gloo": _guard(gloo_info) if has_torch else no_torch,
            "gds": _guard(gds_info),
        },
    }


def _marker(ok: bool, color: bool) -> str:
    text = "[OK]" if ok else "[NO]"
    if not color:
        return text
    return f"\033[92m{text}\033[0m" if ok else f"\033[93m{text}\033[0m"


def render(facts: dict[str, Any], color: bool = False) -> str:
    """The terminal table: one section per kind of fact, columns aligned, [OK]/[NO] in front."""
    lines: list[str] = []

    def section(title: str) -> None:
        lines.extend(["", title, "-" * 72])

    def row(ok: bool | None, name: str, value: str, note: str = "") -> None:
        mark = " " * 4 if ok is None else _marker(ok, color)
        lines.append(f"{mark} {name:<20} {value:<18} {note}".rstrip())

    lines.append("dstrain environment report")
    section("dstrain libraries")
    for name, lib in facts["dstrain_libraries"].items():
        if not lib["installed"]:
            row(False if name in LIBRARIES else None, name, "not installed",
                "" if name in LIBRARIES else "(optional)")
        else:
            row(lib["import_error"] is None, name, str(lib["version"]),
                f"import fails: {lib['import_error']}" if lib["import_error"] else "")
    section("python and packages")
    py = facts["python"]
    row(None, "python", py["version"], py["executable"])
    torch = facts["torch"]
    if torch["available"]:
        row(True, "torch", torch["version"], torch["path"])
        row(None, "CUDA (torch)", torch["cuda"] or "none", "" if torch["cuda"] else "CPU-only torch build")
    else:
        row(False, "torch", "does not import", torch["reason"])
    for dist, pkg in facts["packages"].items():
        if dist != "torch":
            row(None, dist, pkg["version"] if pkg["installed"] else "not installed")
    section("dsaio I/O backends (fastest first)")
    aio = facts["dsaio"]
    if "backends" in aio:
        for name, backend in aio["backends"].items():
            row(bool(backend["available"]), name, "works" if backend["available"] else "unavailable",
                str(backend["reason"]))
    else:
        row(False, "dsaio", "does not import", aio["reason"])
    section("accelerator")
    labels = {"gpu": "GPU", "nccl": "NCCL", "gloo": "gloo", "gds": "GDS (GPUDirect)"}
    for key, fact in facts["accelerator"].items():
        row(bool(fact["available"]), labels.get(key, key), "available" if fact["available"] else "unavailable",
            str(fact.get("reason", "")))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dstrain-report",
                                     description="Versions of the dstrain libraries and their dependencies, and "
                                                 "which I/O backends, GPUs, NCCL and GDS work on this machine.")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON, for scripts")
    args = parser.parse_args(argv)
    facts = collect()
    try:
        if args.json:
            print(json.dumps(facts, indent=2))
        else:
            sys.stdout.write(render(facts, sys.stdout.isatty() and "NO_COLOR" not in os.environ))
        sys.stdout.flush()
    except BrokenPipeError:  # `dstrain-report | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
