"""Which units a forward keeps gathered for its backward (stage3_max_reuse_distance, stage3_max_live_parameters):
decided from sizes and the order of gathers alone, learnt from the micro-step before."""

import torch

from dscompile.reuse import ForwardReuse

SIZES = {0: 400, 1: 400, 2: 800}  # bytes of three units, read in this order in forward and in reverse in backward


def _micro_step(reuse: ForwardReuse) -> tuple[list[int], list[int]]:
    """A forward over units 0, 1, 2 and a backward over 2, 1, 0; which the forward kept and which the backward
    found kept (the caller's live count: what is gathered now, kept buffers included)."""
    reuse.start_forward(training=True)
    live, kept, found = 0, [], []
    for unit, size in SIZES.items():
        assert reuse.on_gather(unit, size) is None
        live += size - reuse.make_room(size, live)
        if reuse.on_release(unit, torch.empty(size // 4), live):
            kept.append(unit)
        else:
            live -= size
    for unit in reversed(SIZES):
        buffer = reuse.on_gather(unit, SIZES[unit])
        if buffer is not None:
            found.append(unit)
        else:
            live += SIZES[unit] - reuse.make_room(SIZES[unit], live)
        live -= SIZES[unit]
    return kept, found


def test_nothing_is_kept_until_a_micro_step_measured_the_distances():
    reuse = ForwardReuse(reuse_bytes=1 << 40, live_bytes=1 << 40)
    assert _micro_step(reuse) == ([], [])
    # bytes read between each forward release and the unit's reuse (unit 2's forward and backward read counted)
    assert reuse.distance == {2: 0, 1: 1600, 0: 2400}
    assert _micro_step(reuse) == ([0, 1, 2], [2, 1, 0])


def test_the_reuse_distance_bounds_what_is_kept():
    reuse = ForwardReuse(reuse_bytes=1600, live_bytes=1 << 40)
    _micro_step(reuse)
    assert _micro_step(reuse) == ([1, 2], [2, 1])  # unit 0 is reused 2400 bytes later, beyond the distance
    off = ForwardReuse(reuse_bytes=0, live_bytes=1 << 40)
    _micro_step(off)
    assert _micro_step(off) == ([2], [2])  # a distance of 0: only what is read again at once


def test_the_live_budget_drops_what_the_backward_reads_last():
    reuse = ForwardReuse(reuse_bytes=1 << 40, live_bytes=1200)
    _micro_step(reuse)
    # units 0 and 1 are kept (800 bytes live); gathering unit 2 (800) drops unit 0, the one backward reads last
    assert _micro_step(reuse) == ([0, 1, 2], [2, 1])


def test_a_forward_without_gradients_keeps_nothing_and_a_new_forward_drops_what_was_kept():
    reuse = ForwardReuse(reuse_bytes=1 << 40, live_bytes=1 << 40)
    _micro_step(reuse)
    reuse.start_forward(training=False)
    assert reuse.on_gather(0, 400) is None and not reuse.on_release(0, torch.empty(100), 400)
    reuse.start_forward(training=True)
    reuse.on_gather(0, 400)
    assert reuse.on_release(0, torch.empty(100), 400) and reuse.kept_bytes == 400
    assert reuse.start_forward(training=True) == 400 and reuse.kept_bytes == 0
