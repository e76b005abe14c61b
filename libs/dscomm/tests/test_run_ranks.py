"""run_ranks on a slow or flaky machine: a failed rendezvous is retried, slow joiners get the whole timeout."""

import os
import time

import pytest
import torch

import dscomm
from dscomm import testing
from dscomm.testing import RankFailure, run_ranks


def world_sum(rank, world):
    t = torch.tensor([float(rank + 1)])
    dscomm.all_reduce(t)
    return int(t.item()), dscomm.get_timeout().total_seconds()


def failing_first_joins(monkeypatch, marker_dir, how, failures=1):
    """Rank 1's first `failures` joins fail for real (the process dies or raises before joining)."""
    real_join = testing._join

    def join(rank, *args):
        attempts = len(os.listdir(marker_dir))
        if rank == 1 and attempts < failures:
            open(os.path.join(marker_dir, f"attempt{attempts}"), "w").close()
            if how == "dies":
                os._exit(3)
            raise ConnectionError("Connection closed by peer (as gloo's connectFullMesh says under load)")
        real_join(rank, *args)

    monkeypatch.setattr(testing, "_join", join)  # forked ranks inherit it


@pytest.mark.parametrize("how", ["dies", "raises"])
def test_a_failed_rendezvous_is_retried_with_a_fresh_init_file(tmp_path, monkeypatch, how):
    failing_first_joins(monkeypatch, tmp_path, how)
    assert run_ranks(world_sum, 2, timeout=60, pg_timeout=20) == [(3, 20.0), (3, 20.0)]
    assert os.listdir(tmp_path) == ["attempt0"]  # one failed attempt, then the run


def test_a_rendezvous_that_keeps_failing_is_reported(tmp_path, monkeypatch):
    failing_first_joins(monkeypatch, tmp_path, "raises", failures=99)
    with pytest.raises(RankFailure, match=r"could not connect their process groups in 3 attempt\(s\)(.|\n)*Connection closed"):
        run_ranks(world_sum, 2, timeout=60)
    assert len(os.listdir(tmp_path)) == testing.RENDEZVOUS_ATTEMPTS


def group_connection_fails_once(rank, world, marker_dir):
    """Rank 1's first run meets what gloo raises when it cannot connect a new group under load."""
    if rank == 1 and not os.listdir(marker_dir):
        open(os.path.join(marker_dir, "attempt0"), "w").close()
        raise RuntimeError("[ProcessGroupGloo.cpp:67] Gloo connectFullMesh failed with [pair.cc:553] Connection "
                           "closed by peer [127.0.0.1]:26278")
    return world_sum(rank, world)


def test_a_group_that_could_not_connect_starts_the_run_again(tmp_path):
    assert run_ranks(group_connection_fails_once, 2, str(tmp_path), timeout=60) == [(3, 60.0), (3, 60.0)]
    assert os.listdir(tmp_path) == ["attempt0"]


def test_runs_with_dying_ranks_are_not_started_again(tmp_path):
    with pytest.raises(RankFailure, match=r"rank 0 of 2 failed:(.|\n)*a peer exited"):  # rank 1's failure
        run_ranks(group_connection_fails_once, 2, str(tmp_path), timeout=60, allow_missing=(0,))
    assert os.listdir(tmp_path) == ["attempt0"]  # reported, not run again


def test_a_slow_joiner_gets_the_whole_timeout_not_the_collective_timeout(monkeypatch):
    real_join = testing._join

    def slow_join(rank, *args):
        time.sleep(4 * rank)  # a rank that starts late on a loaded machine
        real_join(rank, *args)

    monkeypatch.setattr(testing, "_join", slow_join)
    assert run_ranks(world_sum, 2, timeout=60, pg_timeout=1) == [(3, 1.0), (3, 1.0)]
