"""The autotuner on the example GPT (facade/examples/train_gpt.py) at 2 CPU ranks, and its tuners on
synthetic cost functions.

    flock /tmp/dstrain-bench.lock python facade/bench/bench_autotuning.py

1. tuners: how many experiments each tuner needs to reach the optimum of three synthetic 48-point
   stage-2 spaces (pure, no processes; mean over seeds), and how many it runs with the default
   tuner_early_stopping (5) and whether it still ends on the optimum;
2. a fast session (fast: true, every stage, micro-batches up to max_train_batch_size): wall time,
   experiments, the chosen point;
3. the full space (fast: false) over stages 2 and 3 with each tuner: experiments run, the one that
   found the session's best, wall time (single noisy measurements: which point wins varies by run);
4. the chosen config against the starting point (the example's zero2.json: stage 2, micro-batch 8),
   each re-measured `--verify` times alternately as fresh experiments: median throughput and ratio.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_gpt.py"
START = json.loads((ROOT / "examples" / "configs" / "zero2.json").read_text())


# ---------------------------------------------------------------------------- 1. synthetic
def synthetic(seeds: int) -> None:
    from dstrain.autotuning import explore, features, stage_points

    micro = [1, 2, 3, 4, 6, 8, 12, 16]
    points = stage_points(2, [(m, 1, m) for m in micro],
                          {"overlap_comm": (True, False), "reduce_bucket_size": (5 * 10**6, 5 * 10**7, 5 * 10**8)})
    shapes = {
        "separable": lambda p: 100 - 6 * (math.log2(p.micro_batch) - 2.6) ** 2
        - 9 * (math.log10(p.knob("reduce_bucket_size")) - 7.2) ** 2 + (4 if p.knob("overlap_comm") else 0),
        "interaction": lambda p: 100 - 6 * (math.log2(p.micro_batch) - 2.6) ** 2
        - 9 * (math.log10(p.knob("reduce_bucket_size")) - 6 - 0.5 * math.log2(p.micro_batch)) ** 2
        + (4 if p.knob("overlap_comm") else 0),
        "saturating": lambda p: 200 * p.micro_batch / (p.micro_batch + 3) - (40 if p.micro_batch > 12 else 0)
        - 5 * abs(math.log10(p.knob("reduce_bucket_size")) - 7.7) + (3 if not p.knob("overlap_comm") else 0),
    }
    rows = features(points)
    print(f"\n1. tuners on synthetic 48-point spaces, {seeds} seeds each")
    print(f"{'space':<12} {'tuner':<12} {'to optimum (mean, max)':>24} {'run w/ early stop 5':>20} {'found it':>9}")
    for name, shape in shapes.items():
        values = [shape(p) for p in points]
        best = max(range(len(values)), key=values.__getitem__)
        for tuner in ("gridsearch", "random", "model_based"):
            needed, ran, found = [], [], 0
            for seed in range(seeds):
                full = explore(len(points), values.__getitem__, tuner=tuner, metric="throughput",
                               num_trials=len(points), early_stopping=None, rows=rows, seed=seed)
                needed.append([t.index for t in full.trials].index(best) + 1)
                early = explore(len(points), values.__getitem__, tuner=tuner, metric="throughput", num_trials=50,
                                early_stopping=5, rows=rows, seed=seed)
                ran.append(len(early.trials))
                found += early.best.index == best
            print(f"{name:<12} {tuner:<12} {statistics.mean(needed):>15.1f}, {max(needed):>5} "
                  f"{statistics.mean(ran):>20.1f} {found:>5}/{seeds}")


# ---------------------------------------------------------------------------- 2-4. real sessions
def session(folder: Path, config: dict, *script_args: str) -> tuple[float, list[dict], str]:
    """Run `dstrain --autotuning tune` in `folder`; (seconds, summary.csv rows, best name)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tune.json").write_text(json.dumps(config))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dstrain.launcher", "--num_procs", "2", "--autotuning", "tune",
                           str(EXAMPLE), "--deepspeed_config", "tune.json", *script_args], cwd=folder,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - began
    results = folder / "autotuning_results"
    if done.returncode != 0:
        print(done.stderr[-3000:])
        raise SystemExit(f"tuning session in {folder} failed")
    rows = list(csv.DictReader((results / "summary.csv").open()))
    global_row = next(line for line in (results / "summary.txt").read_text().splitlines() if line.startswith("| global"))
    return seconds, rows, global_row.strip("| ").split("|")[-1].strip()


def tuning_config(**autotuning) -> dict:
    config = dict(START)
    config["zero_optimization"] = {}
    config.pop("train_micro_batch_size_per_gpu")
    config["autotuning"] = {"enabled": True, "start_profile_step": 3, "end_profile_step": 10,
                            "max_train_batch_size": 64, **autotuning}
    return config


def one_point(stage: int, micro: int, gas: int, knobs: dict) -> dict:
    config = dict(START)
    config.update(train_micro_batch_size_per_gpu=[micro], gradient_accumulation_steps=gas)
    config["zero_optimization"] = {"stage": stage, **knobs}
    config["autotuning"] = {"enabled": True, "start_profile_step": 3, "end_profile_step": 10, "overwrite": True}
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--verify", type=int, default=3, help="re-measurements of the start and the chosen point")
    parser.add_argument("--skip-real", action="store_true", help="only the synthetic part")
    args = parser.parse_args()
    synthetic(args.seeds)
    if args.skip_real:
        return
    script = ("--corpus-mb", "0.5")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        print(f"\n2. fast session (every stage, micro-batches up to max_train_batch_size 64 at 2 ranks); "
              f"load average {load:.1f} on {os.cpu_count()} cores")
        seconds, rows, best = session(base / "fast", tuning_config(fast=True), *script)
        ok = [r for r in rows if r["status"] == "ok"]
        print(f"   {seconds:.0f} s, {len(rows)} experiments ({len(ok)} ok), chosen {best}")
        for r in rows:
            print(f"     {r['name']:<22} {r['status']:<8} {float(r['throughput_samples_per_s'] or 0):8.1f} samples/s")
        chosen = next(r for r in rows if r["name"] == best)

        print("\n3. full space (fast: false), stages 2 and 3, micro-batches [16, 32], reduce_bucket_size "
              "[1e5, 3e5, 1e6] (below the model's 0.87M parameters, so they matter), each tuner")
        for tuner in ("gridsearch", "random", "model_based"):
            config = tuning_config(fast=False, tuner_type=tuner)
            config.update(zero_optimization={"stage": [2, 3], "reduce_bucket_size": [100_000, 300_000, 1_000_000]},
                          train_micro_batch_size_per_gpu=[16, 32])
            seconds, rows, best = session(base / tuner, config, *script)
            position = [r["name"] for r in rows].index(best) + 1
            print(f"   {tuner:<12} {seconds:5.0f} s, {len(rows):2} experiments, best {best} found at experiment "
                  f"{position}")

        print(f"\n4. chosen ({chosen['name']}) against the start (zero2.json: z2_gas1_tmbspg8), "
              f"{args.verify} alternating re-measurements")
        knobs = dict(kv.split("=") for kv in chosen["knobs"].split(";") if kv)
        knobs = {k: json.loads(v.lower()) if v in ("True", "False") else json.loads(v) for k, v in knobs.items()}
        measured: dict[str, list[float]] = {"start": [], "chosen": []}
        start_zero = {k: v for k, v in START["zero_optimization"].items() if k != "stage"}
        for round_ in range(args.verify):
            for label, config in (("start", one_point(2, 8, 1, start_zero)),
                                  ("chosen", one_point(int(chosen["stage"]), int(chosen["micro_batch"]),
                                                       int(chosen["gradient_accumulation_steps"]), knobs))):
                _, rows, _ = session(base / f"verify_{label}_{round_}", config, *script)
                measured[label].append(float(rows[0]["throughput_samples_per_s"]))
        start, best_value = statistics.median(measured["start"]), statistics.median(measured["chosen"])
        print(f"   start  {start:8.1f} samples/s (runs {', '.join(f'{v:.1f}' for v in measured['start'])})")
        print(f"   chosen {best_value:8.1f} samples/s (runs {', '.join(f'{v:.1f}' for v in measured['chosen'])})")
        print(f"   speed-up {best_value / start:.2f}x; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
