"""Run a function on N real ranks of a gloo process group, for tests (this lib's and the libs above).

Ranks are forked from the calling process, which has already imported torch (~0.1 s per start,
against ~10 s for torchrun here), and rendezvous through a file. A rank that fails reports its
traceback; a rank that hangs is killed at `timeout` and the run fails naming it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


class RankFailure(AssertionError):
    """A rank of `run_ranks` raised, exited without a result, or did not finish in time."""


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
              pg_timeout: float | None = None, backend: str = "gloo", allow_missing: tuple[int, ...] = (),
              **kwargs: Any) -> list[Any]:
    """fn(rank, world_size, *args, **kwargs) on each rank; returns the results in rank order.

    pg_timeout is the process group's own timeout (seconds; default `timeout`). Ranks in
    `allow_missing` may exit without a result (tests of failures); their result is None.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RankFailure("torch.distributed is already initialised in this process: forked ranks would inherit "
                          "its process group instead of joining a new one; initialise only inside the ranks")
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dscomm-ranks-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(fn, rank, world_size, init_file, backend, pg_timeout or timeout, results, args,
                                   kwargs))
                 for rank in range(world_size)]
        for proc in procs:
            proc.start()
        collected: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(collected) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, status, value = results.get(timeout=min(remaining, 0.2))
                collected[rank] = (status, value)
            except queue.Empty:
                done = [r for r, p in enumerate(procs) if not p.is_alive() and r not in collected]
                if done and all(r in allow_missing for r in done) and len(collected) + len(done) == world_size:
                    break
                if any(r not in allow_missing for r in done):
                    time.sleep(0.2)  # its result may still be in the pipe
                    _drain(results, collected)
                    missing = [r for r in done if r not in collected and r not in allow_missing]
                    if missing:
                        _stop(procs)
                        raise RankFailure(f"rank(s) {missing} exited without a result "
                                          f"(exit codes {[procs[r].exitcode for r in missing]})") from None
        _drain(results, collected)
        _stop(procs)
    failures = {r: v for r, (s, v) in collected.items() if s == "error"}
    if failures:
        rank = min(failures)
        raise RankFailure(f"rank {rank} of {world_size} failed:\n{failures[rank]}")
    hung = [r for r in range(world_size) if r not in collected and r not in allow_missing]
    if hung:
        raise RankFailure(f"rank(s) {hung} of {world_size} did not finish within {timeout} s")
    return [pickle.loads(collected[r][1]) if r in collected else None for r in range(world_size)]


def _rank_main(fn, rank, world_size, init_file, backend, pg_timeout, results, args, kwargs):
    import torch

    import dscomm

    torch.set_num_threads(1)  # ranks share the machine's cores; more threads only contend

    try:
        dscomm.init_distributed(dist_backend=backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=pg_timeout))
        value = fn(rank, world_size, *args, **kwargs)
        # Plain pickle bytes: torch's queue would pass tensors as shared memory, which breaks once
        # this process exits before the parent has read them.
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):  # a peer may already be gone
            dscomm.destroy()
        results.close()
        results.join_thread()


def _drain(results, collected) -> None:
    while True:
        try:
            rank, status, value = results.get_nowait()
        except queue.Empty:
            return
        collected[rank] = (status, value)


def _stop(procs) -> None:
    for proc in procs:
        proc.join(timeout=2)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
