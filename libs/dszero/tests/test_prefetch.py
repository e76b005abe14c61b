"""stage3_prefetch_bucket_size: the next units are gathered asynchronously, with unchanged training."""

import torch
from models import TinyGPT, batches, loss_of

import dszero
from dscomm.testing import run_ranks
from dsconfig import OffloadParamConfig, ZeroConfig
from dszero.prefetch import ABSENT, BUSY, KEPT, PrefetchPlan

SIZES = {0: 100, 1: 10, 2: 1, 3: 50}
STEP = [(0, True), (1, True), (2, True), (3, True), (3, False), (2, False), (1, False), (0, False)]


class Units:
    """Stage 3 as the plan sees it: a unit is gathered when needed or chosen, released after its module runs."""

    def __init__(self, plan, kept=()):
        self.plan, self.kept, self.gathered, self.running = plan, set(kept), set(), None

    def state(self, key):
        return BUSY if key == self.running else KEPT if key in self.gathered else ABSENT

    def replay(self, events):
        chosen = []
        for key, forward in events:
            self.plan.on_need(key, SIZES[key], forward)
            self.gathered.add(key)
            self.running = key if forward else None
            chosen.append(self.plan.ahead(self.state))
            self.gathered.update(chosen[-1])
            if not (forward and key in self.kept):  # reuse keeps `kept` from forward to backward
                self.gathered.discard(key)
        return chosen


def recorded(bucket, kept=()):
    plan = PrefetchPlan(bucket)
    assert Units(plan).replay(STEP) == [[]] * len(STEP)  # the first step only records
    plan.end_of_step()
    return Units(plan, kept)


def test_forward_prefetches_the_next_units_and_backward_those_released_after_forward():
    # Unit 3's forward is running when the look-ahead reaches its backward: it waits there, then
    # backward's units (released after their forward) are gathered ahead.
    assert recorded(1000).replay(STEP) == [[1, 2, 3], [], [], [], [2, 1, 0], [], [], []]
    # Units that reuse keeps gathered are passed over.
    assert recorded(1000, kept={0, 1, 2, 3}).replay(STEP) == [[1, 2, 3], [], [], [], [], [], [], []]


def test_the_bucket_bounds_the_elements_chosen_and_not_yet_needed():
    # Chosen while under the bucket; the unit that crosses it still goes (DeepSpeed's rule).
    assert recorded(60).replay(STEP[:2]) == [[1, 2, 3], []]  # 10 + 1 < 60: then 50, crossing it
    assert recorded(11).replay(STEP[:2]) == [[1, 2], [3]]  # 10 + 1 reaches 11; after unit 1's need, 1 + 50
    units = recorded(5)
    units.gathered.update({2})
    assert units.replay(STEP[:1]) == [[1]]  # gathered units cost nothing; 10 crosses 5, nothing after it
    # Units larger than the bucket are prefetched too (before, unit 3 was always gathered on demand).
    assert recorded(5).replay(STEP[:3]) == [[1], [2, 3], []]
    assert PrefetchPlan(0).ahead(lambda k: ABSENT) == []


def test_an_order_off_the_recording_gathers_on_demand_until_a_forward_starts_again():
    units = recorded(1000)
    assert units.replay([(0, True), (2, True)]) == [[1, 2, 3], []]  # unit 1 skipped: off the recording
    assert units.replay([(3, True), (3, False)]) == [[], []]        # stays off for the rest of the step
    assert units.replay([(0, True)]) == [[2, 3]]                    # the first unit's forward: back on
    units.plan.end_of_step()
    # An eval-only forward (no backward), then a training step: both follow the recording.
    units = recorded(1000)
    assert units.replay(STEP[:4])[0] == [1, 2, 3]
    units.gathered.clear()  # as the next backward's end leaves them
    units.plan.end_of_step()
    assert units.replay(STEP) == recorded(1000).replay(STEP)


def test_looking_ahead_costs_time_linear_in_the_needs():
    events = [(k, True) for k in range(2000)] + [(k, False) for k in reversed(range(2000))]
    plan = PrefetchPlan(10**9)
    for key, forward in events:
        plan.on_need(key, 1, forward)
    plan.end_of_step()
    calls = []
    def state(key):
        calls.append(key)
        return KEPT  # reuse keeps everything: nothing to gather, and nothing to look at twice
    for key, forward in events:
        plan.on_need(key, 1, forward)
        plan.ahead(state)
    assert len(calls) <= len(events)


class FlippingGPT(TinyGPT):
    """Runs its blocks in reverse order while `flip` is set: the recorded order no longer holds."""

    flip = False

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in (reversed(self.blocks) if self.flip else self.blocks):
            x = block(x)
        return self.head(x)


def train(rank, world, bucket, distance, flip_at=None, eval_at=None, offload=None):
    torch.manual_seed(0)
    model = FlippingGPT(layers=3)
    cfg = ZeroConfig(stage=3, stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=bucket,
                     stage3_max_reuse_distance=distance, offload_param=offload)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), cfg)
    losses, gathers, prefetched = [], [], []
    for step, (tokens,) in enumerate(batches(5, 1, world, rank)):
        model.flip = flip_at is not None and step >= flip_at
        if step == eval_at:
            with torch.no_grad():
                losses.append(loss_of(model, tokens).item())
        loss = loss_of(model, tokens)
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
        gathers.append(sum(u.gather_count for u in zero.groups))
        prefetched.append(sum(u.prefetch_count for u in zero.groups))
    held = sum(u.gathered_bytes() for u in zero.groups)
    return losses, gathers, prefetched, held


def prefetch_cases(rank, world, tmp):
    nvme = OffloadParamConfig(device="nvme", nvme_path=tmp, max_in_cpu=0, buffer_count=4, buffer_size=100_000)
    cases = {}
    for name, kwargs in {"plain": {}, "eval": {"eval_at": 2}, "flip": {"flip_at": 3}}.items():
        for distance in (0, 10**9) if world == 2 else (10**9,):  # without and with reuse (the default)
            cases[name, distance] = (train(rank, world, 0, distance, **kwargs),
                                     train(rank, world, 20_000, distance, **kwargs))
    if world == 2:
        cases["nvme", 0] = (train(rank, world, 0, 0, offload=nvme), train(rank, world, 20_000, 0, offload=nvme))
    return cases


def check(results):
    for cases in results:
        for (name, distance), (off, on) in cases.items():
            (losses_off, gathers_off, pre_off, _), (losses_on, gathers_on, pre_on, held) = off, on
            torch.testing.assert_close(losses_on, losses_off, rtol=1e-6, atol=0, msg=f"{name}, reuse {distance}")
            assert gathers_on == gathers_off, (name, distance)  # ahead of time, never extra
            assert pre_off[-1] == 0 and pre_on[0] == 0, (name, distance)  # the first step only records
            assert pre_on[1] > 0, (name, distance)  # the second step gathers ahead
            assert held == 0  # nothing left gathered (or in flight) between steps
        # Reuse survives the eval-only forward: later steps gather each unit once, as without an eval.
        plain_gathers, eval_gathers = cases["plain", 10**9][0][1], cases["eval", 10**9][0][1]
        assert eval_gathers[4] - eval_gathers[3] == plain_gathers[4] - plain_gathers[3]
        # Off the recording after the flip: later steps still prefetch forward's first units, fewer in all.
        distance = 0 if ("plain", 0) in cases else 10**9
        plain, flipped = cases["plain", distance][1][2], cases["flip", distance][1][2]
        assert flipped[2] == plain[2] and flipped[4] - flipped[3] < plain[4] - plain[3]


def test_prefetch_trains_exactly_as_on_demand_gathering_at_world_2(tmp_path):
    check(run_ranks(prefetch_cases, 2, str(tmp_path), timeout=180))


def test_prefetch_trains_exactly_as_on_demand_gathering_at_world_4(tmp_path):
    check(run_ranks(prefetch_cases, 4, str(tmp_path), timeout=240))
