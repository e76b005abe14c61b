"""A queue deeper than the kernel lets an engine make is refused when the handle is made, naming
queue_depth and where the limit comes from; it used to fail only at the first transfer (io_setup's
EAGAIN, io_uring_setup's EINVAL)."""

from __future__ import annotations

import numpy as np
import pytest

import dsaio
from dsaio.limits import AIO_MAX_NR, IO_URING_MAX_ENTRIES


def test_limits_come_from_the_kernel_settings(engine):
    limits = dsaio.queue_limits(engine)
    assert limits.engine == engine
    if engine == "aio":
        with open(AIO_MAX_NR) as handle:
            assert limits.events == int(handle.read()) and limits.queue_depth <= limits.events
        assert AIO_MAX_NR in limits.source
    elif engine == "io_uring":
        assert limits.queue_depth == IO_URING_MAX_ENTRIES
    elif engine == "python":
        assert limits.queue_depth is None  # it does not queue


def test_a_queue_deeper_than_the_kernel_allows_is_refused_when_the_handle_is_made(engine, tmp_path):
    limits = dsaio.queue_limits(engine)
    if limits.queue_depth is None:
        pytest.skip(f"the {engine} engine has no queue")
    depth = limits.queue_depth + 1
    with pytest.raises(ValueError, match=rf"queue_depth {depth} is deeper than the {engine} engine's kernel queues "
                                         rf"may be here \(at most {limits.queue_depth}: "):
        handle = dsaio.aio_handle(queue_depth=depth, engine=engine)
        data = np.arange(1 << 16, dtype=np.uint8)
        handle.sync_pwrite(data, str(tmp_path / "f.bin"))  # where the aio engines used to fail


def test_a_usual_depth_still_works(engine, tmp_path):
    handle = dsaio.aio_handle(queue_depth=32, engine=engine)
    data = np.arange(1 << 16, dtype=np.uint8)
    handle.sync_pwrite(data, str(tmp_path / "f.bin"))
    back = np.empty_like(data)
    handle.sync_pread(back, str(tmp_path / "f.bin"))
    assert np.array_equal(back, data)
