"""On gloo, dszero builds gathers and reduce-scatters from faster ops: they must equal the native ones."""

import pytest
import torch
import torch.distributed as dist

import dscomm
from dscomm.testing import run_ranks
from dszero.wire import ALL_REDUCE_FROM, gather_shards, reduce_scatter, start_reduce_scatter


def compare(rank, world, numel):
    gen = torch.Generator().manual_seed(rank)
    flat = torch.randn(numel * world, generator=gen)
    shard = torch.randn(numel, generator=gen)
    native_full = torch.empty(numel * world)
    dscomm.all_gather_into_tensor(native_full, shard)
    full = torch.full((numel * world,), float("nan"))
    gather_shards(full, shard, None)
    full_async = torch.empty(numel * world)
    gather_shards(full_async, shard, None, async_op=True).wait()
    results = {"gather": torch.equal(full, native_full), "gather_async": torch.equal(full_async, native_full)}
    for average in (False, True):
        native = torch.empty(numel)
        op = dscomm.ReduceOp.AVG if average else dscomm.ReduceOp.SUM
        dscomm.reduce_scatter_tensor(native, flat.clone(), op=op)
        out = torch.empty(numel)
        reduce_scatter(out, flat.clone(), None, average=average)
        results[f"reduce_scatter average={average}"] = torch.allclose(out, native, rtol=1e-6, atol=1e-6)
        # Two launched before either is waited for (as stage 3 does in backward): each its own sums.
        pending = [start_reduce_scatter(flat.clone() * k, None, average=average) for k in (1, 2)]
        shards = [p.wait() for p in pending]
        results[f"started average={average}"] = (torch.allclose(shards[0], native, rtol=1e-6, atol=1e-6)
                                                 and torch.allclose(shards[1], 2 * native, rtol=1e-6, atol=1e-5))
        into = torch.empty(numel)
        results[f"started into out average={average}"] = (
            start_reduce_scatter(flat.clone(), None, average=average, out=into).wait() is into
            and torch.equal(into, out))
    results["backend"] = dist.get_backend()
    return results


@pytest.mark.parametrize(("world", "numel"), [(2, 1000), (4, 1000), (2, ALL_REDUCE_FROM // 2 + 8)],
                         ids=["world2", "world4", "world2-all-reduce-sized"])
def test_gloo_built_collectives_equal_the_native_ones(world, numel):
    for results in run_ranks(compare, world, numel, timeout=120):
        assert results.pop("backend") == "gloo"
        assert all(results.values()), results
