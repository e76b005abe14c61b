"""Simulated bubble of every training schedule at equal op costs, as a markdown table.

    flock /tmp/dstrain-bench.lock python libs/dspipe/bench/bench_schedules.py [--ranks 2 4 8] [--micro-batches 8 32]

Costs: a whole stage's F = 1, B = 2 (I = W = 1 when split), messages free. A rank holding k stages
(interleaved chunks, the V schedules) runs each of them at 1/k of that, so makespans compare directly:
the same model, cut finer. Peak activations are in whole-stage units (chunk activations / k).
"""

from __future__ import annotations

import argparse

import dspipe.schedules as sch

ROWS = [("gpipe", None), ("1f1b", None), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("zb_h1", None),
        ("zbv", None), ("dualpipev", None)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()
    print("| schedule | p | m | bubble (idle / compute) | idle share of rank-time | makespan | 1F1B makespan "
          "| peak activations (max rank, stages) |")
    print("|---|---|---|---|---|---|---|---|")
    for p in args.ranks:
        for m in args.micro_batches:
            base = sch.simulate(sch.one_f_one_b(p, m)).makespan
            for name, chunks in ROWS:
                label = name if chunks is None else f"{name} (v={chunks})"
                try:
                    compute = sch.build_schedule(name, p, m, chunks)
                except sch.ScheduleError as exc:
                    print(f"| {label} | {p} | {m} | n/a: {str(exc).split(':')[0]} | | | | |")
                    continue
                k = sch.stages_per_rank(name, chunks)
                layout = sch.placement(name, p, chunks=chunks)
                sch.validate(sch.lower(compute, layout), layout)
                t = sch.simulate(compute, sch.Costs(forward=1 / k, backward=2 / k, input_grad=1 / k, weight_grad=1 / k))
                print(f"| {label} | {p} | {m} | {t.bubble:.4f} | {t.idle_fraction:.1%} | {t.makespan:g} | {base:g} "
                      f"| {max(t.peak_activations) / k:g} |")


if __name__ == "__main__":
    main()
