"""Run a function on N real ranks of a gloo process group, for tests (this lib's and the libs above).

Ranks are forked from the calling process, which has already imported torch (~0.1 s per start,
against ~10 s for torchrun here), and rendezvous through a file. A rank that fails reports its
traceback; a rank that hangs is killed at `timeout` and the run fails naming it.

On a loaded machine gloo's connection set-up now and then fails ("connectFullMesh failed ...
connection closed by peer"), when the ranks join or when `fn` creates a group. That is not the
test's fault, so the run starts again with a fresh init file while `timeout` allows. `fn` starts
only once every rank has joined, so a failed join repeats none of it; a group `fn` could not
connect repeats `fn` from its start (test functions build their groups first). Tests of ranks that
die (`allow_missing`) are not retried.
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

RENDEZVOUS_ATTEMPTS = 3
_GLOO_CONNECT_FAILED = "connectFullMesh failed"  # torch's words when gloo cannot connect a group


class RankFailure(AssertionError):
    """A rank of `run_ranks` raised, exited without a result, or did not finish in time."""


class _RendezvousFailed(Exception):
    """One attempt could not connect its process groups; `detail` says which rank and why."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
              pg_timeout: float | None = None, backend: str = "gloo", allow_missing: tuple[int, ...] = (),
              **kwargs: Any) -> list[Any]:
    """fn(rank, world_size, *args, **kwargs) on each rank; returns the results in rank order.

    pg_timeout is the process group's own timeout for collectives once every rank has joined
    (seconds; default `timeout`); joining may take whatever is left of `timeout`. Ranks in
    `allow_missing` may exit without a result (tests of failures); their result is None.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RankFailure("torch.distributed is already initialised in this process: forked ranks would inherit "
                          "its process group instead of joining a new one; initialise only inside the ranks")
    # torch imports dynamo at a process's first optimizer (seconds per process on a busy machine); once here,
    # every forked rank inherits it instead of importing it again.
    import torch._dynamo  # noqa: F401

    deadline = time.monotonic() + timeout
    failures: list[str] = []
    while True:
        try:
            collected = _attempt(fn, world_size, args, kwargs, deadline, pg_timeout or timeout, backend,
                                 allow_missing)
            break
        except _RendezvousFailed as exc:
            failures.append(exc.detail)
            if len(failures) >= RENDEZVOUS_ATTEMPTS or time.monotonic() >= deadline:
                raise RankFailure(f"the {world_size} ranks could not connect their process groups in "
                                  f"{len(failures)} attempt(s) within {timeout} s; the last attempt: "
                                  f"{failures[-1]}") from None
    errors = {r: v for r, (s, v) in collected.items() if s == "error"}
    if errors:
        rank = min(errors)
        raise RankFailure(f"rank {rank} of {world_size} failed:\n{errors[rank]}")
    hung = [r for r in range(world_size) if r not in collected and r not in allow_missing]
    if hung:
        raise RankFailure(f"rank(s) {hung} of {world_size} did not finish within {timeout} s")
    return [pickle.loads(collected[r][1]) if r in collected else None for r in range(world_size)]


def _attempt(fn, world_size, args, kwargs, deadline, pg_timeout, backend, allow_missing):
    """One start of every rank: their (status, value) by rank, or _RendezvousFailed to try again."""
    ctx = mp.get_context("fork")
    # A fresh queue per attempt: a rank killed while writing would leave the old one's lock held.
    results = ctx.Queue()
    # Shared memory rather than the queue: a rank that os._exit()s right after joining still counts.
    joined = ctx.Array("b", world_size, lock=False)
    with tempfile.TemporaryDirectory(prefix="dscomm-ranks-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(fn, rank, world_size, init_file, backend, deadline, pg_timeout, results, joined,
                                   args, kwargs))
                 for rank in range(world_size)]
        for proc in procs:
            proc.start()
        try:
            collected = _collect(procs, results, joined, world_size, deadline, allow_missing)
        except _RendezvousFailed:
            _kill(procs)
            raise
        _stop(procs)
    return collected


def _collect(procs, results, joined, world_size, deadline, allow_missing) -> dict[int, tuple[str, Any]]:
    collected: dict[int, tuple[str, Any]] = {}
    while len(collected) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            rank, status, value = results.get(timeout=min(remaining, 0.2))
            collected[rank] = (status, value)
            _check_rendezvous(collected, not allow_missing)
            continue
        except queue.Empty:
            pass
        done = [r for r, p in enumerate(procs) if not p.is_alive() and r not in collected]
        if not done:
            continue
        time.sleep(0.2)  # a result may still be in the pipe
        _drain(results, collected)
        _check_rendezvous(collected, not allow_missing)
        silent = [r for r in done if r not in collected]
        lost = [r for r in silent if not joined[r]]
        if lost:
            raise _RendezvousFailed(f"rank(s) {lost} exited while joining (exit codes "
                                    f"{[procs[r].exitcode for r in lost]})")
        missing = [r for r in silent if r not in allow_missing]
        if missing:
            _stop(procs)
            raise RankFailure(f"rank(s) {missing} exited without a result "
                              f"(exit codes {[procs[r].exitcode for r in missing]})")
        if len(collected) + len(silent) == world_size:
            break  # the rest are ranks allowed to exit without a result
    _drain(results, collected)
    _check_rendezvous(collected, not allow_missing)
    return collected


def _check_rendezvous(collected, retry_groups: bool) -> None:
    failed = sorted(r for r, (status, _) in collected.items() if status == "rendezvous")
    if failed:
        raise _RendezvousFailed(f"rank {failed[0]} could not join:\n{collected[failed[0]][1]}")
    if retry_groups:
        unconnected = sorted(r for r, (status, text) in collected.items()
                             if status == "error" and _GLOO_CONNECT_FAILED in text)
        if unconnected:
            rank = unconnected[0]
            raise _RendezvousFailed(f"rank {rank} could not connect a group:\n{collected[rank][1]}")


def _rank_main(fn, rank, world_size, init_file, backend, deadline, pg_timeout, results, joined, args, kwargs):
    import torch

    import dscomm

    torch.set_num_threads(1)  # ranks share the machine's cores; more threads only contend

    stage, finished = "rendezvous", False
    try:
        _join(rank, world_size, init_file, backend, deadline, pg_timeout)
        joined[rank] = 1
        stage = "error"
        value = fn(rank, world_size, *args, **kwargs)
        # Plain pickle bytes: torch's queue would pass tensors as shared memory, which breaks once
        # this process exits before the parent has read them.
        results.put((rank, "ok", pickle.dumps(value)))
        finished = True
    except BaseException:
        results.put((rank, stage, traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):  # a peer may already be gone
            # A finished rank waits for its peers before leaving; a failed one leaves at once, so they fail fast.
            dscomm.destroy(synchronize=finished)
        results.close()
        results.join_thread()


def _join(rank, world_size, init_file, backend, deadline, pg_timeout) -> None:
    """Form the process group with all the time left, check every rank is in it, then use pg_timeout."""
    import torch.distributed as dist

    import dscomm
    from dscomm import backend as comm_backend

    patience = datetime.timedelta(seconds=max(deadline - time.monotonic(), 1.0))
    dscomm.init_distributed(dist_backend=backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=patience)
    dist.barrier()  # every pair of ranks is connected and alive before fn runs
    comm_backend.set_timeout(datetime.timedelta(seconds=pg_timeout))


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
    _kill(procs)


def _kill(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=5)
