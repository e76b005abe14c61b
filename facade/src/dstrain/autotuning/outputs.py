"""What a tuning session shows and leaves behind, as DeepSpeed's autotuner does: a progress line per
experiment, the summary table (terminal and results_dir/summary.txt), every experiment as CSV
(results_dir/summary.csv), and the best config (ds_config_optimal.json) with its command
(cmd_optimal.txt)."""

from __future__ import annotations

import csv
import datetime
import io
import json
from collections.abc import Sequence
from pathlib import Path

from . import ranking
from .owned_dirs import OwnedDir
from .search import Progress, SearchResult

CSV_COLUMNS = ("name", "space", "role", "stage", "micro_batch", "gradient_accumulation_steps", "train_batch_size",
               "knobs", "status", "reused", "latency_ms", "throughput_samples_per_s", "flops_per_device",
               "peak_memory_bytes", "seconds", "reason")


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


def format_value(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric == "flops":
        for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
            if value >= scale:
                return f"{value / scale:.2f} {unit}FLOPS"
        return f"{value:.0f} FLOPS"
    return f"{value:.2f}"


def progress_line(p: Progress, metric: str) -> str:
    """`[3/~12] z1_gas1_tmbspg4: 812.31 samples/s (best z1_gas1_tmbspg4) | 0:00:31 elapsed, ~0:02:10 left`."""
    record = p.record
    if record.outcome.ok:
        what = f"{format_value(metric, record.value(metric))} {ranking.UNITS[metric]}"
    else:
        what = f"{record.outcome.status} ({record.outcome.reason}), skipped"
    if record.outcome.reused:
        what += " [earlier result]"
    best = f" (best {p.best.point.name})" if p.best is not None else ""
    left = f", ~{_duration(p.left * p.seconds_per_run)} left" if p.left and p.seconds_per_run else (
        "" if p.left else ", last planned")
    return (f"[{p.number}/~{p.number + p.left}] {record.point.name} ({record.role}): {what}{best} | "
            f"{_duration(p.elapsed)} elapsed{left}")


def _table(header: Sequence[str], rows: list[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else (":" + "-" * (w - 1))
                             for i, w in enumerate(widths)) + " |"
    return [line(header), rule, *(line(r) for r in rows)]


def summary_text(result: SearchResult) -> str:
    metric = result.metric
    rows = []
    for space in result.spaces():
        records = [r for r in result.records if r.point.space == space]
        best = ranking.ranked(records, metric, lambda r: r.value(metric), lambda r: r.point.name)
        rows.append([space, str(len(records)), format_value(metric, best[0].value(metric)) if best else "-",
                     best[0].point.name if best else "-"])
    best = result.best
    rows.append(["global", str(len(result.records)), format_value(metric, best.value(metric)) if best else "-",
                 best.point.name if best else "-"])
    lines = [f"Autotuning summary (metric: {metric}, {ranking.UNITS[metric]}; "
             f"{'lower' if ranking.lower_is_better(metric) else 'higher'} is better)", ""]
    lines += _table(("tuning_space", "num_experiments", "best_metric_val", "best_exp_name"), rows, {1, 2})
    lines += ["", "Experiments:", ""]
    exp_rows = []
    for r in result.records:
        m = r.outcome.metrics if r.outcome.ok else {}
        status = r.outcome.status + (" (earlier)" if r.outcome.reused else "")
        exp_rows.append([r.point.name, str(r.point.stage), str(r.point.micro_batch), str(r.point.gas),
                         str(r.point.train_batch), status, format_value("latency", m.get("latency")),
                         format_value("throughput", m.get("throughput")), format_value("flops", m.get("flops")),
                         f"{m['peak_memory_bytes'] / 2**30:.2f}" if m.get("peak_memory_bytes") else "-",
                         f"{r.outcome.seconds:.1f}"])
    lines += _table(("experiment", "stage", "micro", "gas", "batch", "status", "ms/step", "samples/s", "flops/dev",
                     "peak GiB", "run s"), exp_rows, {1, 2, 3, 4, 6, 7, 8, 9, 10})
    failed = [r for r in result.records if not r.outcome.ok]
    if failed:
        lines += ["", "Failed experiments (skipped):"]
        lines += [f"  {r.point.name}: {r.outcome.status}: {r.outcome.reason}" for r in failed]
    if result.notes:
        lines += ["", "Notes:"] + [f"  {note}" for note in result.notes]
    lines += ["", f"Tuning completed in {_duration(result.seconds)}. Total number of experiments: "
                  f"{len(result.records)} ({sum(1 for r in result.records if r.outcome.reused)} from earlier results)."]
    return "\n".join(lines)


def summary_csv(result: SearchResult) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in result.records:
        m = r.outcome.metrics if r.outcome.ok else {}
        writer.writerow([r.point.name, r.point.space, r.role, r.point.stage, r.point.micro_batch, r.point.gas,
                         r.point.train_batch, ";".join(f"{k}={v}" for k, v in r.point.knobs), r.outcome.status,
                         int(r.outcome.reused), _number(m.get("latency")), _number(m.get("throughput")),
                         _number(m.get("flops")), _number(m.get("peak_memory_bytes")), f"{r.outcome.seconds:.3f}",
                         r.outcome.reason])
    return out.getvalue()


def _number(value: object) -> str:
    return repr(float(value)) if isinstance(value, (int, float)) else ""


RESULT_NAMES = ("summary.txt", "summary.csv", "ds_config_optimal.json", "cmd_optimal.txt")


def write_results(result: SearchResult, results: OwnedDir, *, optimal: dict | None = None,
                  optimal_command: str | None = None) -> list[Path]:
    """summary.txt, summary.csv and, when an experiment succeeded, ds_config_optimal.json and cmd_optimal.txt,
    each written whole (through a partial file) into the results folder, never through a link."""
    written = []
    for name, text in (("summary.txt", summary_text(result) + "\n"), ("summary.csv", summary_csv(result))):
        written.append(results.write_text(name, text))
    if optimal is not None:
        written.append(results.write_text("ds_config_optimal.json", json.dumps(optimal, indent=2) + "\n"))
    if optimal_command is not None:
        written.append(results.write_text("cmd_optimal.txt", optimal_command + "\n"))
    return written
