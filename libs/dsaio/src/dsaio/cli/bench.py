"""dsaio-bench (DeepSpeed's ds_io): read or write N bytes with one handle configuration."""

from __future__ import annotations

import argparse
import os
import sys

from ..engines import PREFERENCE
from ._measure import measure, median, parse_size


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsaio-bench", description=__doc__)
    p.add_argument("--path", required=True, help="directory (a file dsaio-bench.dat is used) or file")
    p.add_argument("--size", default="1G", help="bytes per run, e.g. 256M, 1G (default 1G)")
    p.add_argument("--op", choices=["read", "write"], default="read")
    p.add_argument("--engine", choices=PREFERENCE, default=None, help="default: the fastest that works")
    p.add_argument("--block_size", type=parse_size, default=1 << 20)
    p.add_argument("--queue_depth", type=int, default=8)
    p.add_argument("--intra_op_parallelism", type=int, default=1)
    p.add_argument("--single_submit", action="store_true")
    p.add_argument("--no_overlap_events", action="store_true")
    p.add_argument("--loops", type=int, default=5, help="runs; the median is reported (default 5)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    path = os.path.join(args.path, "dsaio-bench.dat") if os.path.isdir(args.path) else args.path
    config = {"block_size": args.block_size, "queue_depth": args.queue_depth,
              "intra_op_parallelism": args.intra_op_parallelism, "single_submit": args.single_submit,
              "overlap_events": not args.no_overlap_events, "engine": args.engine}
    rates = measure(path, parse_size(args.size), args.op, args.loops, config, progress=args.op)
    print(file=sys.stderr)
    print(f"{args.op} {args.size} {config}: median {median(rates):.3f} GB/s "
          f"(runs: {', '.join(f'{r:.3f}' for r in rates)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
