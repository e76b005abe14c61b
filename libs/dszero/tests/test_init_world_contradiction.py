"""dszero.Init refuses to partition over a one-rank process group when the launcher started several processes:
every rank would build the whole model (an out-of-memory that looks like a model too big)."""

import os

import pytest
import torch
import torch.distributed as dist

import dszero
from dscomm.testing import run_ranks
from dszero.init import _contradicting_single_rank_pg_error


def init_over_a_one_rank_world(rank, world):
    # run_ranks started one rank; pretend a launcher had asked for two (as torchrun would say)
    os.environ["WORLD_SIZE"] = "2"
    try:
        with dszero.Init():
            torch.nn.Linear(4, 4)
    except dszero.ZeroError as exc:
        refused = str(exc)
    else:
        refused = ""
    with dszero.Init(data_parallel_group=dist.group.WORLD):  # a one-rank group given on purpose: taken as meant
        explicit = torch.nn.Linear(4, 4)
    os.environ["WORLD_SIZE"] = "1"
    with dszero.Init():
        plain = torch.nn.Linear(4, 4)
    return refused, explicit.weight.ds_shape, plain.weight.ds_shape


def test_a_one_rank_group_under_a_multi_process_launcher_is_refused_by_name():
    refused, explicit_shape, plain_shape = run_ranks(init_over_a_one_rank_world, 1, timeout=60)[0]
    assert "process group of 1 rank" in refused and "WORLD_SIZE=2" in refused and "init_distributed" in refused
    assert tuple(explicit_shape) == tuple(plain_shape) == (4, 4)


@pytest.mark.parametrize(("world", "explicit", "env", "refused"), [
    (1, None, {"WORLD_SIZE": "8"}, True),
    (1, None, {"WORLD_SIZE": "1"}, False),
    (1, None, {}, False),
    (8, None, {"WORLD_SIZE": "8"}, False),
    (1, object(), {"WORLD_SIZE": "8"}, False),
    (1, None, {"WORLD_SIZE": ""}, False),
    (1, None, {"WORLD_SIZE": "eight"}, False),
    (1, None, {"WORLD_SIZE": None}, False),
])
def test_when_a_one_rank_group_contradicts_the_launcher(world, explicit, env, refused):
    message = _contradicting_single_rank_pg_error(world, explicit, env=env)
    assert (message is not None) == refused
