"""Every collective on real gloo ranks against a reference computed locally, per dtype and world size.

Each case is also run through dscomm's emulation (forced), which must give the native result.
"""

import pytest
import torch

import dscomm
from dscomm import emulation
from dscomm.testing import run_ranks

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]
ALL_OPS = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
           "all_to_all_single")


def data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank-specific values, exact in every dtype tested (small integers)."""
    return (torch.arange(numel) % 7 + rank * 3).to(dtype)


def check_all(rank, world, dtype, force_emulation):
    forced = emulation.forced(*ALL_OPS) if force_emulation else _nothing()
    n = 4 * world
    everyone = [data(r, n, dtype) for r in range(world)]
    with forced:
        t = data(rank, n, dtype)
        dscomm.all_reduce(t)
        assert torch.equal(t, sum(everyone).to(dtype)), "all_reduce SUM"

        t = data(rank, n, dtype)
        dscomm.all_reduce(t, op=dscomm.ReduceOp.MAX)
        assert torch.equal(t, torch.stack(everyone).max(0).values), "all_reduce MAX"

        if dtype.is_floating_point:
            t = data(rank, n, dtype)
            dscomm.all_reduce(t, op=dscomm.ReduceOp.AVG)
            expected = (torch.stack([e.double() for e in everyone]).mean(0)).to(dtype)
            assert torch.allclose(t.double(), expected.double(), rtol=1e-2), "all_reduce AVG"

        t = data(rank, n, dtype)
        dscomm.reduce(t, dst=world - 1)
        if rank == world - 1:
            assert torch.equal(t, sum(everyone).to(dtype)), "reduce"

        t = data(rank, n, dtype) if rank == 1 else torch.zeros(n, dtype=dtype)
        dscomm.broadcast(t, src=1)
        assert torch.equal(t, everyone[1]), "broadcast"

        outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
        dscomm.all_gather(outs, data(rank, n, dtype))
        assert all(torch.equal(o, e) for o, e in zip(outs, everyone)), "all_gather"

        out = torch.empty(n * world, dtype=dtype)
        dscomm.all_gather_into_tensor(out, data(rank, n, dtype))
        assert torch.equal(out, torch.cat(everyone)), "all_gather_into_tensor"

        out = torch.empty(n // world, dtype=dtype)
        dscomm.reduce_scatter_tensor(out, data(rank, n, dtype))
        assert torch.equal(out, sum(everyone).to(dtype).chunk(world)[rank]), "reduce_scatter_tensor"

        out = torch.empty(n, dtype=dtype)
        dscomm.all_to_all_single(out, data(rank, n, dtype))
        expected = torch.cat([e.chunk(world)[rank] for e in everyone])
        assert torch.equal(out, expected), "all_to_all_single (even)"

        # Uneven: rank r sends r + 1 + p elements to peer p.
        send_splits = [rank + 1 + p for p in range(world)]
        recv_splits = [r + 1 + rank for r in range(world)]
        payload = torch.arange(sum(send_splits)).to(dtype) + 100 * rank
        out = torch.empty(sum(recv_splits), dtype=dtype)
        dscomm.all_to_all_single(out, payload, recv_splits, send_splits)
        pieces = []
        for r in range(world):
            splits = [r + 1 + p for p in range(world)]
            theirs = torch.arange(sum(splits)).to(dtype) + 100 * r
            pieces.append(theirs.split(splits)[rank])
        assert torch.equal(out, torch.cat(pieces)), "all_to_all_single (uneven)"
    return str(dtype)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_every_dtype(rank, world, force_emulation):
    return [check_all(rank, world, dtype, force_emulation) for dtype in DTYPES]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("force_emulation", [False, True], ids=["native", "emulated"])
def test_every_collective_every_dtype(world, force_emulation):
    results = run_ranks(run_every_dtype, world, force_emulation, timeout=120)
    assert results == [[str(d) for d in DTYPES]] * world


def async_and_p2p(rank, world):
    t = torch.full((1024,), float(rank))
    handle = dscomm.all_reduce(t, async_op=True)
    assert isinstance(handle, dscomm.CommHandle)
    handle.wait()
    assert torch.all(t == sum(range(world)))

    out = torch.empty(8 * world)
    handle = dscomm.all_gather_into_tensor(out, torch.full((8,), float(rank)), async_op=True)
    handle.wait()
    assert handle.is_completed()
    assert torch.equal(out, torch.arange(world).float().repeat_interleave(8))

    # A ring of point-to-point messages, sync and async, and as one batch.
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(3)
    if rank % 2 == 0:
        dscomm.send(torch.full((3,), float(rank)), right)
        sender = dscomm.recv(got, left)
    else:
        sender = dscomm.recv(got, left)
        dscomm.send(torch.full((3,), float(rank)), right)
    assert sender == left and torch.all(got == left)

    got = torch.empty(5)
    reqs = [dscomm.isend(torch.full((5,), float(rank)), right), dscomm.irecv(got, left)]
    for req in reqs:
        req.wait()
    assert torch.all(got == left)

    got = torch.empty(2, dtype=torch.int64)
    ops = [dscomm.P2POp(torch.distributed.isend, torch.tensor([rank, rank]), right),
           dscomm.P2POp(torch.distributed.irecv, got, left)]
    for req in dscomm.batch_isend_irecv(ops):
        req.wait()
    assert got.tolist() == [left, left]
    dscomm.barrier()
    return "ok"


@pytest.mark.parametrize("world", [2, 4])
def test_async_handles_and_point_to_point(world):
    assert run_ranks(async_and_p2p, world, timeout=60) == ["ok"] * world


def integer_average_is_refused(rank, world):
    with emulation.forced("all_reduce"):
        try:
            dscomm.all_reduce(torch.ones(2, dtype=torch.int64), op=dscomm.ReduceOp.AVG)
        except dscomm.CommError as exc:
            return str(exc)
    return "no error"


def test_integer_average_is_a_clear_error():
    messages = run_ranks(integer_average_is_refused, 2, timeout=60)
    assert all("needs a floating-point tensor" in m for m in messages)


def wrong_sizes(rank, world):
    with emulation.forced("all_to_all_single"):
        try:
            dscomm.all_to_all_single(torch.empty(3), torch.empty(4), [1, 1], [3, 3])
        except dscomm.CommError as exc:
            return str(exc)
    return "no error"


def test_bad_split_sizes_are_named():
    messages = run_ranks(wrong_sizes, 2, timeout=60)
    assert all("input_split_sizes [3, 3]" in m for m in messages)
