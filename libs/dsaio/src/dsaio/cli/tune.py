"""dsaio-tune (DeepSpeed's ds_nvme_tune): sweep handle settings on a path, print the best as an
"aio" config snippet."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

from ..engines import backends
from ._measure import measure, median, parse_size

FULL = {"block_size": [256 << 10, 1 << 20, 4 << 20], "queue_depth": [4, 8, 32, 128],
        "intra_op_parallelism": [1, 2, 4], "single_submit": [False, True], "overlap_events": [False, True]}
QUICK = {"block_size": [1 << 20, 4 << 20], "queue_depth": [8, 32], "intra_op_parallelism": [1, 2],
         "single_submit": [False], "overlap_events": [True]}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsaio-tune", description=__doc__)
    p.add_argument("--path", "--nvme_dir", dest="path", required=True, help="directory on the device to tune")
    p.add_argument("--io_size", type=parse_size, default=None, help="bytes per run (default 1G, 64M with --quick)")
    p.add_argument("--loops", type=int, default=None, help="runs per setting (default 3, 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="a small sweep that ends in about a minute")
    p.add_argument("--engines", default=None, help="comma-separated (default: every engine that works here)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    grid = QUICK if args.quick else FULL
    size = args.io_size or ((64 << 20) if args.quick else (1 << 30))
    loops = args.loops or (1 if args.quick else 3)
    working = [n for n, i in backends().items() if i["available"] and n != "python"] or ["python"]
    engines = args.engines.split(",") if args.engines else (working[:2] if args.quick else working)
    path = os.path.join(args.path, "dsaio-tune.dat")
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    rows = []
    total = len(combos) * len(engines)
    try:
        for k, (engine, combo) in enumerate(itertools.product(engines, combos), 1):
            config = dict(combo, engine=engine)
            label = f"[{k}/{total}] {engine} bs={combo['block_size'] >> 10}K qd={combo['queue_depth']} " \
                    f"p={combo['intra_op_parallelism']}"
            write = median(measure(path, size, "write", loops, config, progress=label + " write"))
            read = median(measure(path, size, "read", loops, config, progress=label + " read"))
            rows.append((config, read, write))
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print(file=sys.stderr)
    print(f"{'engine':9} {'block':>7} {'qd':>4} {'par':>3} {'single':>6} {'overlap':>7} {'read GB/s':>9} {'write GB/s':>10}")
    for c, r, w in sorted(rows, key=lambda x: -x[1]):
        print(f"{c['engine']:9} {c['block_size'] >> 10:>6}K {c['queue_depth']:>4} {c['intra_op_parallelism']:>3} "
              f"{c['single_submit']!s:>6} {c['overlap_events']!s:>7} {r:>9.3f} {w:>10.3f}")
    for what, index in (("read", 1), ("write", 2)):
        best = max(rows, key=lambda x: x[index])
        c = best[0]
        snippet = {"aio": {"block_size": c["block_size"], "queue_depth": c["queue_depth"],
                           "intra_op_parallelism": c["intra_op_parallelism"],
                           "single_submit": c["single_submit"], "overlap_events": c["overlap_events"]}}
        print(f"best {what}: {best[index]:.3f} GB/s with engine {c['engine']!r} (DSAIO_ENGINE={c['engine']})")
        print(json.dumps(snippet, indent=2)[1:-1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
