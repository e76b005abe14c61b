"""Import time of dsconfig and time to load the largest corpus config, beside the anchors.

Each figure is the median of several fresh interpreters (imports are measured cold, in a
subprocess). Anchors, side by side in the same run: `import torch` always; `import deepspeed`
and DeepSpeed's own DeepSpeedConfig parsing when a Python with deepspeed is given by --deepspeed-python.

    python bench/bench_load.py [--runs 7] [--deepspeed-python /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"


# The largest corpus file DeepSpeed 0.19.8 itself accepts (the largest overall, a compression_training
# config, is refused by DeepSpeed), so both parsers read the same file.
SHARED = CORPUS / "microsoft__Megatron-DeepSpeed__examples__ds_config.json"


def largest_config() -> Path:
    return max(CORPUS.glob("*.json"), key=lambda p: p.stat().st_size)


def timed(python: str, setup: str, statement: str, runs: int) -> float:
    """Median seconds of `statement` after `setup`, each run in a fresh interpreter."""
    code = (f"import time\n{setup}\nt0 = time.perf_counter()\n{statement}\n"
            f"print(time.perf_counter() - t0)")
    samples = []
    for _ in range(runs):
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--deepspeed-python", default=None)
    args = parser.parse_args()
    quiet = "import warnings; warnings.simplefilter('ignore')"

    def dsconfig_load(path: Path) -> float:
        return timed(sys.executable, f"import dsconfig; {quiet}",
                     f"[dsconfig.load({str(path)!r}, world_size=1, strict=False) for _ in range(100)]", args.runs) / 100

    rows = [
        ("import dsconfig", timed(sys.executable, "", "import dsconfig", args.runs)),
        ("import torch (anchor)", timed(sys.executable, "", "import torch", args.runs)),
        ("dsconfig.load(largest corpus file)", dsconfig_load(largest_config())),
        ("dsconfig.load(largest both accept)", dsconfig_load(SHARED)),
    ]
    if args.deepspeed_python:
        ds_parse = (f"[DeepSpeedConfig({str(SHARED)!r}) for _ in range(100)]")
        ds_setup = ("import os; os.environ.setdefault('DS_ACCELERATOR', 'cpu'); "
                    "from deepspeed.runtime.config import DeepSpeedConfig; import logging; "
                    "logging.disable(logging.CRITICAL)")
        rows += [
            ("import deepspeed (anchor)", timed(args.deepspeed_python, "", "import deepspeed", args.runs)),
            ("DeepSpeedConfig(largest both accept) (anchor)",
             timed(args.deepspeed_python, ds_setup, ds_parse, args.runs) / 100),
        ]
    width = max(len(name) for name, _ in rows)
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds * 1e3:9.3f} ms")
    by_name = dict(rows)
    print(f"import torch / import dsconfig: {by_name['import torch (anchor)'] / by_name['import dsconfig']:.1f}x")
    if args.deepspeed_python:
        print(f"import deepspeed / import dsconfig: "
              f"{by_name['import deepspeed (anchor)'] / by_name['import dsconfig']:.1f}x")
        print(f"DeepSpeedConfig / dsconfig.load (same file): "
              f"{by_name['DeepSpeedConfig(largest both accept) (anchor)'] / by_name['dsconfig.load(largest both accept)']:.1f}x")


if __name__ == "__main__":
    main()
