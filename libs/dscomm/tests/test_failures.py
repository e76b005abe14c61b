"""A peer that dies or never joins: the others fail within the timeout, with an error naming what and who."""

import os
import time

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
    with pytest.raises(RankFailure, match=r"rank\(s\) \[1\] of 2 did not finish within 2"):
        run_ranks(lambda rank, world: time.sleep(30 * rank), 2, timeout=2)
