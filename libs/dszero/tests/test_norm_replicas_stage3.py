"""norm_replicas at stage 3: a parameter group held whole by every tensor rank (tensor parallelism beside
ZeRO over the data group) counts once in the global gradient norm, as it does at stages 0-2.

4 gloo ranks as tensor 2 x data 2: every rank holds the same model (replicated over the tensor group),
ZeRO partitions over the data group and decides the norm over the norm group (every rank). With
"norm_replicas": 2 the norm equals one process's; the stage-3 units used to ignore the key (sqrt(2) too big).
"""

import math

import pytest
import torch
from torch import nn

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def batch(replica):
    gen = torch.Generator().manual_seed(replica)
    return torch.randn(4, 6, generator=gen, dtype=torch.float64), torch.randn(4, 3, generator=gen, dtype=torch.float64)


def reference_norm() -> float:
    net = model()
    for replica in range(2):
        x, y = batch(replica)
        (((net(x) - y) ** 2).mean() / 2).backward()
    return math.sqrt(sum(p.grad.pow(2).sum().item() for p in net.parameters()))


def norm_rank(rank, world, stage):
    groups = dscomm.ParallelDims(world, tensor=2).build()
    net = model()
    optimizer = torch.optim.SGD([{"params": list(net.parameters()), "norm_replicas": 2}], lr=0.1)
    zero = dszero.ZeroOptimizer(net, optimizer, ZeroConfig(stage=stage), precision="fp64", group=groups.data,
                                norm_group=groups.norm)
    x, y = batch(groups.rank_in("data"))
    zero.backward(((net(x) - y) ** 2).mean())
    zero.step()
    return zero.get_global_grad_norm()


@pytest.mark.parametrize("stage", [1, 3])
def test_replicated_groups_count_once_in_the_norm(stage):
    expected = reference_norm()
    for norm in run_ranks(norm_rank, 4, stage, timeout=120):
        assert norm == pytest.approx(expected, rel=1e-12)
