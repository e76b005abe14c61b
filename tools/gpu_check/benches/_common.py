"""What the GPU check's benchmarks share: arguments, timing (CUDA events on a GPU, the host clock on the CPU),
medians over interleaved rounds, and the JSON they hand the driver (one figure: a median beside its anchor
measured in the same run, the ratio and the target)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]


def parse(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the figures here (the driver reads them)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, one round, on the CPU when there is no GPU: checks the script, measures nothing")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (torch.cuda.is_available() is False); --smoke runs it on the CPU")
    return args


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def seconds_per_call(fn: Callable[[], object], iters: int) -> float:
    """Seconds per call of `fn`, over `iters` calls run back to back (CUDA events on a GPU)."""
    if torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / iters
    began = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - began) / iters


def interleaved(variants: dict[str, Callable[[], object]], rounds: int, iters: int, warmup: int = 2
                ) -> dict[str, list[float]]:
    """Each variant's seconds per call in every round; within a round the variants run one after the other,
    their order alternating, so a drift of clocks or temperature falls on all alike."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(seconds_per_call(variants[name], iters))
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def figure(name: str, value: float, unit: str, anchor: str, anchor_value: float, target: str, runs: int,
           **detail: object) -> dict:
    """A measured figure; ratio = value / anchor_value (a time ratio, or a rate ratio: the target says which)."""
    return {"name": name, "status": "measured", "value": value, "unit": unit, "anchor": anchor,
            "anchor_value": anchor_value, "ratio": value / anchor_value if anchor_value else None, "target": target,
            "runs": runs, "command": " ".join(["python", *_relative(sys.argv)]), "detail": detail}


def skipped(name: str, reason: str, unit: str = "", anchor: str = "", target: str = "") -> dict:
    return {"name": name, "status": "skipped", "reason": reason, "unit": unit, "anchor": anchor, "target": target}


def write(args: argparse.Namespace, figures: list[dict]) -> None:
    for f in figures:
        if f["status"] == "measured":
            print(f"{f['name']}: {f['value']:.4g} {f['unit']} against {f['anchor']} {f['anchor_value']:.4g} "
                  f"{f['unit']}: ratio {f['ratio']:.3g} (target {f['target']})", flush=True)
        else:
            print(f"{f['name']}: {f['status']} ({f.get('reason', '')})", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"figures": figures}, indent=2) + "\n")


def _relative(argv: list[str]) -> list[str]:
    shown = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--json":  # the driver's scratch file: not part of what reproduces the figure
            skip = True
            continue
        path = Path(arg)
        shown.append(str(path.resolve().relative_to(ROOT)) if path.is_absolute() and ROOT in path.resolve().parents
                     else arg)
    return shown
