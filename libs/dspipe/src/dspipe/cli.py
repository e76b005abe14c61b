"""`dspipe`: look at pipeline schedules without a model or a process group.

    dspipe show --schedule zb_h1 --stages 4 --micro-batches 8 [--chunks V] [--costs F=1,B=2,I=1,W=1,comm=0]
                [--actions] [--png out.png]
    dspipe show --from-trace rank0.json rank1.json [--schedule zb_h1 --stages 2 --micro-batches 8] [--png out.png]
    dspipe list

`show` prints one row per rank (idle as `.`) and the bubble. With --from-trace it draws the measured
timeline of a run (the format is in dspipe/schedules/trace.py); adding --schedule also simulates that
schedule with the trace's measured op times, for comparison. Imports no torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import ScheduleError
from .schedules import (
    SCHEDULES,
    Costs,
    Timeline,
    build_schedule,
    lower,
    placement,
    read_trace,
    schedule_name,
    simulate,
    validate,
)
from .schedules.render import render_png, render_text

_CONSTRAINTS = {
    "gpipe": "any p, m",
    "1f1b": "any p, m; DeepSpeed's TrainSchedule order",
    "interleaved_1f1b": "--chunks v (default 2): rank r holds stages r, r+p, ...",
    "zb_h1": "any p, m; backward split into I and W",
    "zbv": "V placement: rank r holds stages r and 2p-1-r",
    "dualpipev": "V placement; m >= 2p",
    "inference": "forward only",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name in SCHEDULES:
                print(f"{name:<18} {_CONSTRAINTS[name]}")
            return 0
        return _show(args, parser)
    except ScheduleError as exc:
        print(f"dspipe: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspipe", description="Pipeline schedules: timelines and bubbles.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the schedules and what each needs")
    show = commands.add_parser("show", help="a schedule's simulated timeline, or a measured one from a trace")
    show.add_argument("--schedule", help=f"one of: {', '.join(SCHEDULES)}")
    show.add_argument("--stages", type=int, help="pipeline depth in ranks (p)")
    show.add_argument("--micro-batches", type=int, help="micro-batches per batch (m)")
    show.add_argument("--chunks", type=int, help="stages per rank for interleaved_1f1b (v, default 2)")
    show.add_argument("--costs", default="", help="op costs, e.g. F=1,B=2,I=1,W=1,comm=0 (these are the defaults)")
    show.add_argument("--actions", action="store_true", help="also print each rank's lowered program")
    show.add_argument("--png", help="also draw the timeline into this PNG file")
    show.add_argument("--from-trace", nargs="+", metavar="TRACE", help="JSON trace file(s) of a real run")
    show.add_argument("--width", type=int, default=160, help="characters per line; longer timelines wrap")
    return parser


def _show(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.width < 20:
        raise ScheduleError(f"--width must be at least 20, got {args.width}")
    costs = _costs(args.costs)
    if args.from_trace:
        events = read_trace(*args.from_trace)
        measured = Timeline.of(events)
        print(f"measured ({', '.join(args.from_trace)}): {measured.summary()}")
        print(render_text(measured, line_width=args.width))
        if args.schedule:
            compute = _build(args, parser)
            simulated = simulate(compute, Costs.from_trace(events, comm=costs.comm))
            print(f"simulated {schedule_name(args.schedule)} with the measured op times: {simulated.summary()}")
        _maybe_png(measured, args.png)
        return 0
    compute = _build(args, parser)
    name = schedule_name(args.schedule)
    layout = placement(name, args.stages, chunks=args.chunks)
    program = lower(compute, layout)
    validate(program, layout)
    timeline = simulate(compute, costs)
    chunks = f", {layout.stages // layout.ranks} stages per rank" if layout.stages > layout.ranks else ""
    print(f"{name}: {args.stages} ranks, {args.micro_batches} micro-batches{chunks} (validated, lowered program "
          f"deadlock-free)")
    print(render_text(timeline, line_width=args.width))
    print(timeline.summary())
    if args.actions:
        for rank, ops in enumerate(program):
            print(f"rank {rank}: {' '.join(map(str, ops))}")
    _maybe_png(timeline, args.png)
    return 0


def _build(args: argparse.Namespace, parser: argparse.ArgumentParser):
    missing = [flag for flag, value in (("--schedule", args.schedule), ("--stages", args.stages),
                                        ("--micro-batches", args.micro_batches)) if value is None]
    if missing:
        parser.error(f"show needs {', '.join(missing)} (or --from-trace alone)")
    return build_schedule(args.schedule, args.stages, args.micro_batches, args.chunks)


def _costs(text: str) -> Costs:
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ScheduleError(f"--costs: expected KEY=NUMBER items such as F=1,B=2, got {item!r}")
    return Costs.from_mapping(values)


def _maybe_png(timeline: Timeline, path: str | None) -> None:
    if path:
        render_png(timeline, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
