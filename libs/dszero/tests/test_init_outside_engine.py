"""A model built under dszero.Init holds shards: calling it outside a stage-3 engine names the problem."""

import torch

import dszero
from dscomm.testing import run_ranks


def call_partitioned(rank, world):
    with dszero.Init():
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    try:
        model(torch.ones(3, 4))
    except dszero.ZeroError as exc:
        refused = str(exc)
    else:
        refused = ""
    with dszero.GatheredParameters(list(model.parameters())):
        gathered = tuple(model(torch.ones(3, 4)).shape)
    return refused, gathered


def test_calling_an_init_built_model_outside_the_engine_says_why():
    for refused, gathered in run_ranks(call_partitioned, 2, timeout=60):
        assert "built inside dszero.Init" in refused and "'weight' is partitioned" in refused
        assert gathered == (3, 2)

