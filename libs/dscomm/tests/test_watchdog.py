"""The watchdog names a rank that stopped answering, and what it was doing, on every rank within its
timeout, and the job ends (exit code 75) instead of waiting out the process group's timeout; a rank that
leaves on purpose is not named, and a busy one keeps beating."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dscomm
from dscomm import watchdog
from dscomm.testing import run_ranks

HERE = Path(__file__).parent


def _start_collecting(timeout_s):
    named = []
    dog = watchdog.start(timeout_s=timeout_s, on_stall=named.append)
    return dog, named


def silent_without_leaving(rank, world):
    watchdog.record(f"step 3 on rank {rank}")
    dscomm.barrier()
    dog, named = _start_collecting(1.0)
    time.sleep(0.3)  # a few heartbeats
    if rank == 1:
        dog._stop.set()  # the heartbeat ends without a word, as in a stopped process
        time.sleep(4)
        return None
    deadline = time.monotonic() + 10
    while not named and time.monotonic() < deadline:
        time.sleep(0.05)
    dog._stop.set()  # before the exit hook marks this rank as done
    return named


def test_a_silent_rank_is_named_with_what_it_was_doing():
    named = run_ranks(silent_without_leaving, 2, timeout=60)[0]
    assert len(named) == 1, named
    message = named[0]
    assert message.startswith("dscomm watchdog on rank 0: rank 1 (process ") and "stopped answering" in message
    assert "At its last heartbeat it was doing: step 3 on rank 1 (for " in message
    assert "its last collective: barrier over the world group of ranks [0, 1]" in message


def leaves_or_works(rank, world):
    _, named = _start_collecting(1.0)
    dscomm.barrier()
    if rank == 1:
        watchdog.stop()  # leaves on purpose; its process lives on without beating
        time.sleep(3)
        return None
    torch.randn(600, 600) @ torch.randn(600, 600)
    for _ in range(30):  # busy in Python and in torch: the heartbeat thread still runs
        sum(i * i for i in range(20000))
        time.sleep(0.05)
    return named


def test_a_rank_that_leaves_or_is_busy_is_not_named():
    assert run_ranks(leaves_or_works, 2, timeout=60)[0] == []


def test_a_world_of_one_has_no_watchdog():
    assert watchdog.start(timeout_s=1.0) is None


def _stop_one(tmp_path, init, world, stopped):
    procs = [subprocess.Popen([sys.executable, str(HERE / "watchdog_worker.py"), str(rank), str(world), init],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
    outputs = {}
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)
        time.sleep(0.5)  # a few steps and heartbeats
        os.kill(procs[stopped].pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        for rank in range(world):
            if rank != stopped:
                outputs[rank] = procs[rank].communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert took < 20, f"the other ranks took {took:.0f} s to end (watchdog timeout 3 s)"
    for rank, (_, err) in outputs.items():
        assert procs[rank].returncode == watchdog.STALL_EXIT_CODE, (rank, procs[rank].returncode, err[-3000:])
    return procs, {rank: err for rank, (_, err) in outputs.items()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP and /proc")
def test_a_stopped_rank_ends_the_job_on_every_rank_naming_it(tmp_path):
    procs, errors = _stop_one(tmp_path, str(tmp_path / "rendezvous"), 3, stopped=1)
    for rank, err in errors.items():
        line = next((line for line in err.splitlines() if "stopped answering" in line), err[-3000:])
        assert f"rank 1 (process {procs[1].pid} on " in line and "stopped (SIGSTOP)" in line, line
        assert "At its last heartbeat it was doing: training step " in line and " on rank 1 (for " in line, line
        assert "all_reduce over the world group of ranks [0, 1, 2]" in line, line
        assert f"dscomm watchdog on rank {rank}:" in line, line


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP and /proc")
def test_a_stopped_rank_hosting_the_store_ends_the_job_too(tmp_path):
    # Launched without torchrun, rank 0 hosts the TCPStore: stopped, it blocks every store request.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _, errors = _stop_one(tmp_path, f"127.0.0.1:{port}", 2, stopped=0)
    line = next((line for line in errors[1].splitlines() if "stopped answering" in line), errors[1][-3000:])
    assert line.startswith("ERROR dscomm: dscomm watchdog on rank 1: "), line
    assert "rank 0 (process " in line or "store stopped answering for 3 s (watchdog timeout 3 s): its host, rank 0" in line, \
        line


def test_a_rank_whose_collective_fails_after_a_verdict_ends_on_the_verdict(tmp_path):
    # The peer left because its watchdog named a stall: the failing collective reports the stall, not the aftermath
    # (which rank learns first is a race; every rank must say the same).
    init = str(tmp_path / "rendezvous")
    procs = [subprocess.Popen([sys.executable, str(HERE / "verdict_worker.py"), str(rank), init],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    verdict = next((line for line in out.splitlines() if line.startswith("verdict: ")), out + err)
    assert "dscomm watchdog on rank 0: rank 7 (process 1 on a host) stopped answering" in verdict, out + err
