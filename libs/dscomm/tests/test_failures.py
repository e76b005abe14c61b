"""A peer that dies or never joins: the others fail within the timeout, with an error naming what and who."""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dscomm
from dscomm.testing import RankFailure, run_ranks


def one_rank_exits(rank, world):
    dscomm.barrier()  # every connection is up: the failure below is the death, not a half-made mesh
    if rank == world - 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    try:
        t = torch.ones(1 << 16)
        for _ in range(50):
            dscomm.all_reduce(t)
    except dscomm.CommError as exc:
        return str(exc), time.monotonic() - start
    return "no error", time.monotonic() - start


@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_that_exits_early_fails_the_others_with_a_clear_error(world):
    results = run_ranks(one_rank_exits, world, timeout=60, pg_timeout=10, allow_missing=(world - 1,))
    for message, seconds in results[:-1]:
        assert message.startswith("all_reduce failed on rank"), message
        assert f"the world group of ranks {list(range(world))}" in message
        assert seconds < 15
    assert results[-1] is None


def silent_peer(rank, world):
    if rank == 1:
        time.sleep(8)  # alive, but never joins the collective
        return "slept"
    start = time.monotonic()
    try:
        dscomm.all_reduce(torch.ones(4))
    except dscomm.CommError as exc:
        return str(exc), time.monotonic() - start
    return "no error", time.monotonic() - start


def test_a_peer_that_never_calls_times_out_with_a_clear_error():
    message, seconds = run_ranks(silent_peer, 2, timeout=60, pg_timeout=3)[0]
    assert "all_reduce failed on rank 0" in message and "[0, 1]" in message
    assert "within the timeout" in message or "exited" in message
    assert seconds < 8


def gloo_threads():
    names = [Path(path).read_text().strip() for path in glob.glob("/proc/self/task/*/comm")]
    return sorted(name for name in names if "gloo" in name)


def silent_peer_then_more(rank, world):
    if rank == 1:
        time.sleep(8)
        return None
    before = gloo_threads()
    try:
        dscomm.all_reduce(torch.ones(4))
    except dscomm.CommError as exc:  # still inside the handler, as a user's code would be
        first, joined, left = str(exc), dscomm.is_initialized(), gloo_threads()
    try:
        dscomm.all_reduce(torch.ones(4))
    except dscomm.CommError as exc:
        second = str(exc)
    return before, first, joined, left, second


def test_a_timeout_shuts_the_process_groups_down_before_the_error_propagates():
    before, first, joined, left, second = run_ranks(silent_peer_then_more, 2, timeout=60, pg_timeout=3)[0]
    assert before and "pt_gloo_runloop" in before  # what there was to shut down
    assert "within the timeout" in first and first.endswith("dscomm shut the process groups down")
    assert not joined and left == []  # gloo's worker and socket threads are joined, not left to process exit
    assert "shut the process groups down after an earlier failure" in second
    assert first.removesuffix("; dscomm shut the process groups down") in second  # which failure it was


HERE = Path(__file__).parent


def test_a_stopped_peer_ends_the_others_cleanly(tmp_path):
    """Real processes, real interpreter exit: the CommError leaves the script and nothing of gloo is left."""
    init = str(tmp_path / "rendezvous")
    procs = [subprocess.Popen([sys.executable, str(HERE / "stopped_peer_worker.py"), str(rank), init],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        assert procs[1].stdout.readline().strip() == "ready", procs[1].communicate(timeout=60)
        os.kill(procs[1].pid, signal.SIGSTOP)
        out, err = procs[0].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert procs[0].returncode == 1, err[-3000:]
    assert "CommError: all_reduce failed on rank 0" in err and "within the timeout" in err
    assert "terminate called" not in err
    (at_exit,) = [line for line in out.splitlines() if line.startswith("threads at exit:")]
    assert "gloo" not in at_exit, at_exit


def never_joined(rank, world):
    return "unreachable"


def test_a_rank_that_never_joins_fails_init_within_the_timeout(tmp_path):
    import datetime

    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def lonely():
        start = time.monotonic()
        try:
            dscomm.init_distributed(init_method=f"file://{tmp_path}/rdv", rank=0, world_size=2,
                                    timeout=datetime.timedelta(seconds=3))
            queue.put(("joined", 0))
        except dscomm.CommError as exc:
            queue.put((str(exc), time.monotonic() - start))

    proc = ctx.Process(target=lonely)
    proc.start()
    message, seconds = queue.get(timeout=60)
    proc.join(timeout=10)
    assert "rank 0 of 2 could not join the process group" in message
    assert "Did every rank start" in message and seconds < 30


def test_a_hung_rank_fails_the_test_run_not_ci():
    # 8 s: time for rank 0 to start and join even on a loaded machine; rank 1 would sleep far longer.
    with pytest.raises(RankFailure, match=r"rank\(s\) \[1\] of 2 did not finish within 8 s$"):
        run_ranks(lambda rank, world: time.sleep(600 * rank), 2, timeout=8)
