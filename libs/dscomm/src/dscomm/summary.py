"""Summaries of the comms log: per op and message size, on this rank or gathered from all ranks."""

from __future__ import annotations

import pickle
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from .backend import collective_device
from .bandwidth import bandwidths, size_str
from .logger import LOGGER, Record


def _by_key(records: list[Record]) -> dict[tuple[str, int], list[Record]]:
    grouped: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for record in records:
        record.resolve()
        grouped[(record.name, record.nbytes)].append(record)
    return grouped


def _entry(records: list[Record]) -> dict[str, Any]:
    latencies = [r.latency_ms or 0.0 for r in records]
    total = sum(latencies)
    average = total / len(latencies)
    algbw, busbw = bandwidths(records[0].op, records[0].nbytes, average, records[0].group_size)
    return {
        "op": records[0].op, "count": len(records), "group_size": records[0].group_size,
        "msg_size_bytes": records[0].nbytes, "msg_size_str": size_str(records[0].nbytes),
        "total_latency_ms": total, "avg_latency_ms": average,
        "algbw_GBps": algbw, "busbw_GBps": busbw,
        # DeepSpeed's keys, in gigabits per second
        "tput_avg_gbps": algbw * 8, "busbw_avg_gbps": busbw * 8,
        "latencies_ms": latencies,
    }


def get_comms_log() -> dict[str, dict[int, dict[str, Any]]]:
    """This rank's log as plain data: {log name: {message bytes: {count, latencies, bandwidths...}}}."""
    summary: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for (name, nbytes), records in sorted(_by_key(LOGGER.records).items()):
        summary[name][nbytes] = _entry(records)
    return dict(summary)


def log_summary(show_straggler: bool = False, return_dict: bool = False) -> dict | None:
    """Gather every rank's log (collective: call on all ranks); rank 0 prints one table.

    Latencies are averaged over ranks. The straggler effect of an op is, summed over its calls,
    each rank's latency minus the fastest rank's, reported for the slowest rank.
    """
    local = get_comms_log()
    world = dist.get_world_size() if dist.is_initialized() else 1
    gathered = [local] * world
    if world > 1:
        gathered = _gather_objects(local, world)
    merged = _merge(gathered)
    stragglers = _stragglers(gathered) if show_straggler else {}
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(_table(merged, stragglers, world), flush=True)
    if return_dict:
        return {"summary": merged, "straggler_analysis": stragglers, "metadata": {"world_size": world}}
    return None


def _gather_objects(obj: Any, world: int) -> list[Any]:
    """all_gather of picklable objects; unlike torch's all_gather_object it needs no numpy."""
    # Straight through torch (not dscomm's ops): the summary's own traffic stays out of the log it summarises.
    device = collective_device()
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.int64, device=device))
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    buffers = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(buffers, padded)
    return [pickle.loads(bytes(buf[: int(size.item())].cpu().tolist())) for buf, size in zip(buffers, sizes)]


def _merge(per_rank: list[dict]) -> dict:
    merged: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for name in sorted({name for log in per_rank for name in log}):
        for nbytes in sorted({n for log in per_rank for n in log.get(name, {})}):
            entries = [log[name][nbytes] for log in per_rank if nbytes in log.get(name, {})]
            average = sum(e["avg_latency_ms"] for e in entries) / len(entries)
            first = entries[0]
            algbw, busbw = bandwidths(first["op"], nbytes, average, first["group_size"])
            merged[name][nbytes] = {
                **{k: first[k] for k in ("op", "count", "group_size", "msg_size_bytes", "msg_size_str")},
                "ranks": len(entries), "avg_latency_ms": average,
                "total_latency_ms": sum(e["total_latency_ms"] for e in entries) / len(entries),
                "algbw_GBps": algbw, "busbw_GBps": busbw, "tput_avg_gbps": algbw * 8, "busbw_avg_gbps": busbw * 8,
            }
    return dict(merged)


def _stragglers(per_rank: list[dict]) -> dict:
    result: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for name in sorted({name for log in per_rank for name in log}):
        for nbytes in sorted({n for log in per_rank for n in log.get(name, {})}):
            series = {rank: log[name][nbytes]["latencies_ms"] for rank, log in enumerate(per_rank)
                      if nbytes in log.get(name, {})}
            calls = min(len(s) for s in series.values())
            fastest = [min(s[i] for s in series.values()) for i in range(calls)]
            effect = {rank: sum(s[i] - fastest[i] for i in range(calls)) for rank, s in series.items()}
            worst = max(effect, key=effect.get)
            result[name][nbytes] = {"straggler_ms": effect[worst], "rank": worst, "per_rank_ms": effect}
    return dict(result)


def _table(merged: dict, stragglers: dict, world: int) -> str:
    header = ["op", "message size", "count", "total latency (ms)", "avg latency (ms)", "algbw (GB/s)",
              "busbw (GB/s)"]
    if stragglers:
        header.append("straggler (ms, rank)")
    rows = []
    for name, sizes in merged.items():
        for nbytes, entry in sizes.items():
            row = [name, entry["msg_size_str"], str(entry["count"]), f"{entry['total_latency_ms']:.3f}",
                   f"{entry['avg_latency_ms']:.3f}", f"{entry['algbw_GBps']:.3f}", f"{entry['busbw_GBps']:.3f}"]
            if stragglers:
                s = stragglers[name][nbytes]
                row.append(f"{s['straggler_ms']:.3f} (rank {s['rank']})")
            rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [f"dscomm summary: {world} rank(s), latencies averaged over ranks",
             "  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    if not rows:
        lines.append("(no operations were logged; is comms logging enabled?)")
    return "\n".join(lines)
