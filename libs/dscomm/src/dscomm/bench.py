"""`dscomm-bench`: latency and bandwidth of the main collectives, dscomm beside raw torch.distributed.

    dscomm-bench --world-size 2 --min-size 1KiB --max-size 64MiB       # forks its own gloo ranks
    torchrun --nproc_per_node 8 -m dscomm.bench                         # or under any launcher

For each op and message size, the raw torch.distributed call, the dscomm call with logging off and
(with --log) with logging on run interleaved, trial by trial, so machine noise hits all alike;
the medians are printed with algbw, busbw and dscomm's ratio to raw.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "KB": 1 << 10, "MIB": 1 << 20, "MB": 1 << 20, "GIB": 1 << 30, "GB": 1 << 30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1KiB, 64MiB or 4096")
    return int(float(match.group(1)) * _UNITS[unit])


def _calls(op: str, nbytes: int, world: int, dtype: torch.dtype):
    """(raw call, dscomm call) on buffers of `nbytes` (per the nccl-tests size convention)."""
    import dscomm

    elem = torch.tensor([], dtype=dtype).element_size()
    numel = max(world, nbytes // elem // world * world)
    big = torch.ones(numel, dtype=dtype)
    part = torch.ones(numel // world, dtype=dtype)
    out = torch.empty(numel, dtype=dtype)
    gather_all = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter_reduce = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        return (lambda: dist.all_reduce(big)), (lambda: dscomm.all_reduce(big))
    if op == "all_gather":
        return (lambda: gather_all(out, part)), (lambda: dscomm.all_gather_into_tensor(out, part))
    if op == "reduce_scatter":
        return (lambda: scatter_reduce(part, big)), (lambda: dscomm.reduce_scatter_tensor(part, big))
    if op == "all_to_all":
        return (lambda: dist.all_to_all_single(out, big)), (lambda: dscomm.all_to_all_single(out, big))
    if op == "broadcast":
        return (lambda: dist.broadcast(big, 0)), (lambda: dscomm.broadcast(big, 0))
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


_DSCOMM_OP = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
              "reduce_scatter": "reduce_scatter_tensor", "all_to_all": "all_to_all_single", "broadcast": "broadcast"}


def _timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> list[dict]:
    import dscomm
    from dscomm.bandwidth import bandwidths, size_str

    world = dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    rows = []
    size = args.min_size
    while size <= args.max_size:
        for op in args.ops:
            raw, wrapped = _calls(op, size, world, dtype)
            for _ in range(args.warmup):
                raw(), wrapped()
            samples: dict[str, list[float]] = {"raw": [], "dscomm": [], "logged": []}
            for trial in range(args.trials):
                # Alternate who goes first, so neither side always gets the warmer caches.
                order = ["raw", "dscomm", "logged"] if trial % 2 == 0 else ["logged", "dscomm", "raw"]
                for kind in order:
                    if kind == "raw":
                        samples["raw"].append(_timed(raw))
                    elif kind == "dscomm":
                        samples["dscomm"].append(_timed(wrapped))
                    elif args.log:
                        dscomm.configure(enabled=True)
                        samples["logged"].append(_timed(wrapped))
                        dscomm.configure(enabled=False)
            dscomm.reset_comms_log()
            medians = {k: statistics.median(v) for k, v in samples.items() if v}
            # Overheads are medians of per-trial ratios: each pair ran back to back, so drift cancels.
            paired = statistics.median(d / r for d, r in zip(samples["dscomm"], samples["raw"]))
            paired_log = statistics.median(g / r for g, r in zip(samples["logged"], samples["raw"])) if args.log else 1.0
            # Every rank must agree on the figures: take the slowest rank's.
            agreed = torch.tensor([medians["raw"], medians["dscomm"], medians.get("logged", 0.0), paired, paired_log],
                                  dtype=torch.float64)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            raw_s, ds_s, logged_s, paired, paired_log = agreed.tolist()
            algbw, busbw = bandwidths(_DSCOMM_OP[op], size, ds_s * 1e3, world)
            rows.append({"op": op, "size": size, "size_str": size_str(size), "raw_ms": raw_s * 1e3,
                         "dscomm_ms": ds_s * 1e3, "logged_ms": logged_s * 1e3 if args.log else None,
                         "algbw_GBps": algbw, "busbw_GBps": busbw, "overhead": paired - 1,
                         "log_overhead": (paired_log - 1) if args.log else None})
        size *= args.step
    return rows


def format_rows(rows: list[dict], world: int, backend: str) -> str:
    lines = [f"dscomm-bench: {world} ranks, backend {backend}; median latencies; overhead = median of "
             f"per-trial dscomm / raw - 1",
             f"{'op':<15}{'size':>10}{'raw ms':>11}{'dscomm ms':>11}{'algbw GB/s':>12}{'busbw GB/s':>12}"
             f"{'overhead':>10}{'logged':>10}"]
    for row in rows:
        logged = f"{row['log_overhead']:+.1%}" if row["log_overhead"] is not None else "-"
        lines.append(f"{row['op']:<15}{row['size_str']:>10}{row['raw_ms']:>11.3f}{row['dscomm_ms']:>11.3f}"
                     f"{row['algbw_GBps']:>12.3f}{row['busbw_GBps']:>12.3f}{row['overhead']:>+10.1%}{logged:>10}")
    big = [r["overhead"] for r in rows if r["size"] >= 1 << 20]
    if big:
        lines.append(f"median overhead at >= 1 MiB: {statistics.median(big):+.2%} (logging off)")
    logged_big = [r["log_overhead"] for r in rows if r["size"] >= 1 << 20 and r["log_overhead"] is not None]
    if logged_big:
        lines.append(f"median overhead at >= 1 MiB: {statistics.median(logged_big):+.2%} (logging on)")
    return "\n".join(lines)


def wrapper_cost_us(calls: int = 20000) -> tuple[float, float]:
    """Per-call cost (µs) of dscomm.all_reduce beyond dist.all_reduce, logging off and on.

    Measured in a world of one, where there is no communication to add noise: what remains is the
    Python cost of the wrapper, which a large message amortises.
    """
    import dscomm

    dscomm.init_distributed()
    t = torch.ones(4)
    results = []
    for logged in (False, True):
        dscomm.configure(enabled=logged)
        best = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            raw = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(calls):
                dscomm.all_reduce(t)
            best.append((time.perf_counter() - start - raw) / calls * 1e6)
        results.append(statistics.median(best))
    dscomm.configure(enabled=False)
    dscomm.reset_comms_log()
    dscomm.destroy()
    return results[0], results[1]


def _rank_main(rank: int, world: int, args: argparse.Namespace) -> str | None:
    torch.set_num_threads(1)  # ranks share the machine's cores
    rows = run(args)
    return (format_rows(rows, world, dist.get_backend()), rows) if rank == 0 else None


def _cost_lines(rows: list[dict], cost: tuple[float, float]) -> str:
    lines = [f"dscomm.all_reduce cost beyond dist.all_reduce, per call (world of one): {cost[0]:.1f} µs "
             f"(logging off), {cost[1]:.1f} µs (logging on)"]
    for row in rows:
        if row["op"] == "all_reduce" and row["size"] >= 1 << 20:
            lines.append(f"  = {cost[0] / (row['raw_ms'] * 1e3):.2%} / {cost[1] / (row['raw_ms'] * 1e3):.2%} "
                         f"of a {row['size_str']} all_reduce ({row['raw_ms']:.3f} ms)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dscomm-bench", description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2, help="ranks to fork when not under a launcher")
    p.add_argument("--ops", type=lambda s: s.split(","), default=list(OPS), help=",".join(OPS))
    p.add_argument("--min-size", type=parse_size, default=parse_size("1KiB"))
    p.add_argument("--max-size", type=parse_size, default=parse_size("64MiB"))
    p.add_argument("--step", type=int, default=4, help="multiply the size by this between rows")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--log", action="store_true", help="also time dscomm with the comms logger on")
    p.add_argument("--wrapper-calls", type=int, default=0,
                   help="also measure dscomm's per-call cost over this many tiny all_reduces")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    unknown = [op for op in args.ops if op not in OPS]
    if unknown:
        parser().error(f"unknown ops {unknown}; choose from {', '.join(OPS)}")
    if "RANK" in os.environ:  # under torchrun / dstrain
        import dscomm

        dscomm.init_distributed()
        out = _rank_main(dscomm.get_rank(), dscomm.get_world_size(), args)
        dscomm.destroy()
    else:
        from dscomm.testing import run_ranks

        out = run_ranks(_rank_main, args.world_size, args, timeout=24 * 3600)[0]
    if out:
        text, rows = out
        if args.wrapper_calls and "RANK" not in os.environ:  # under a launcher there is no world of one
            text += "\n" + _cost_lines(rows, wrapper_cost_us(args.wrapper_calls))
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
