"""What each map part of one analysis records, so that the reduce merges parts of one run and only those.

A part (one worker's thread, one metric) removes its record when it starts and writes it, atomically, after
its files: `part.json` in its directory, with the analysis's run id, where the part sits (worker, thread,
sample range) and what it computed. The reduce reads every part's record and refuses a part without one (it
was killed, or never ran), a mix of run ids (a rerun that stopped half way beside the parts of an earlier
one), and a part computed for another split or metric; the sample count alone cannot tell them apart.

The run id is shared by the whole analysis ("analysis" scope) when it is given (`run_id=`), agreed by
run_map_reduce over torch.distributed, or when one worker is the whole analysis. Workers started
separately without one each make their own ("worker" scope): then each worker's parts must share its id,
and the reduce warns that a worker left from an earlier run cannot be told apart (DeepSpeed's scripts run
workers this way, so it is not refused).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Sequence
from typing import Any

from .errors import DataEfficiencyError
from .logs import logger

RECORD = "part.json"
RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_run_id() -> str:
    return uuid.uuid4().hex


def checked_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise DataEfficiencyError(f"DataAnalyzer(run_id={run_id!r}): a run id is 1 to 128 letters, digits or "
                                  f"'._:-' (the same on every worker of one analysis)")
    return run_id


def forget(directory: str) -> None:
    """Before a part writes anything: its earlier record no longer describes what is in the directory."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, RECORD))


def record(directory: str, **fields: Any) -> None:
    """After a part wrote its files: its record, replaced atomically (a killed write leaves none)."""
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{RECORD}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(fields, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, os.path.join(directory, RECORD))
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _read(directory: str) -> dict | None:
    path = os.path.join(directory, RECORD)
    try:
        with open(path) as handle:
            found = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DataEfficiencyError(f"{path}: unreadable part record ({exc}); rerun run_map for this part") from None
    if not isinstance(found, dict):
        raise DataEfficiencyError(f"{path}: a part record is a JSON object; rerun run_map for this part")
    return found


def run_of(directory: str) -> tuple[str, str] | None:
    """(run id, run scope) a finished part in `directory` recorded (None: none finished there, or unreadable)."""
    try:
        found = _read(directory)
    except DataEfficiencyError:
        return None
    return (str(found["run_id"]), str(found.get("run_scope"))) if found and "run_id" in found else None


def check_parts(metric: str, parts: Sequence[str], expected: Sequence[dict], run_id: str | None) -> str:
    """The run id every part of `metric` shares; DataEfficiencyError naming the parts that differ.

    `expected`: for each part, the fields its record must hold (worker, thread, sample range, metric).
    `run_id`: the id this analyzer's own run_map used, when it ran one (the parts must be its own)."""
    records = [_read(part) for part in parts]
    missing = [part for part, found in zip(parts, records) if found is None]
    if missing:
        raise DataEfficiencyError(
            f"metric {metric!r}: {len(missing)} of {len(parts)} map part(s) did not finish (no {RECORD}): "
            f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}; run_map was killed there or never ran. "
            f"Rerun run_map on every worker (the same run_id on each) before run_reduce")
    for part, found, wanted in zip(parts, records, expected):
        differing = {key: found.get(key) for key, value in wanted.items() if found.get(key) != value}
        if differing:
            raise DataEfficiencyError(f"metric {metric!r}: map part {part} was computed as {differing}, but this "
                                      f"analysis has {({key: wanted[key] for key in differing})}; rerun run_map with "
                                      f"the same workers, threads and metrics everywhere")
    return _one_run(metric, parts, records, run_id)


def _one_run(metric: str, parts: Sequence[str], records: list[dict], run_id: str | None) -> str:
    runs: dict[str, list[str]] = {}
    by_worker: dict[int, set[str]] = {}
    for part, found in zip(parts, records):
        runs.setdefault(str(found.get("run_id")), []).append(part)
        by_worker.setdefault(found.get("worker"), set()).add(str(found.get("run_id")))
    separate = any(found.get("run_scope") == "worker" for found in records)
    mixed = any(len(ids) > 1 for ids in by_worker.values()) or (not separate and len(runs) > 1) or \
        (separate and any(found.get("run_scope") != "worker" for found in records))
    if mixed or (run_id is not None and run_id not in runs):
        listing = "; ".join(f"run {rid}: {len(where)} part(s), e.g. {where[0]}" for rid, where in runs.items())
        own = f" (this analyzer's run_map was run {run_id})" if run_id is not None else ""
        raise DataEfficiencyError(
            f"metric {metric!r}: the map parts come from different runs{own}: {listing}. Merging them would mix "
            f"two analyses; rerun run_map on every worker (workers started separately: the same run_id=... on each)")
    if separate and len(by_worker) > 1:
        logger.warning(f"metric {metric!r}: the {len(by_worker)} workers ran their maps separately without a shared "
                       f"run_id, so a worker's parts left from an earlier analysis cannot be told apart from this "
                       f"one's; give every worker the same DataAnalyzer(run_id=...) (run_map_reduce agrees on one)")
    return next(iter(runs)) if len(runs) == 1 else "per worker: " + ", ".join(sorted(runs))
