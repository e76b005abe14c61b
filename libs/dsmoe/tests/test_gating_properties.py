"""Properties every routing keeps, for any logits: no expert over capacity, one token per slot,
weights that sum to 1 (or 0 for a token that lost every route), counts that add up."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dsmoe

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def gate_cases(draw):
    tokens = draw(st.integers(1, 40))
    experts = draw(st.integers(2, 8))
    k = draw(st.integers(1, min(4, experts)))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.0, 0.5, 3.0, 20.0]))  # 0: every gate equal (all ties)
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed)) * scale
    return logits, k, draw(st.floats(0.1, 3.0)), draw(st.integers(0, 6)), draw(st.booleans()), seed


def route(logits, k, factor, min_capacity, drop, seed):
    gen = torch.Generator().manual_seed(seed)
    if k == 1:
        return dsmoe.route_top1(logits, factor, min(min_capacity, logits.shape[0]), drop_tokens=drop, generator=gen)
    if k == 2:
        return dsmoe.route_top2(logits, factor, min_capacity, drop, generator=gen)
    return dsmoe.route_topk(logits, k, factor, min_capacity, drop)


@SETTINGS
@given(gate_cases())
def test_no_expert_over_capacity_and_one_token_per_slot(case):
    logits, k, factor, min_capacity, drop, seed = case
    r = route(logits, k, factor, min_capacity, drop, seed)
    assert ((r.slots >= 0) & (r.slots < r.capacity)).all()
    pairs = set(zip(r.experts.tolist(), r.slots.tolist(), strict=True))
    assert len(pairs) == r.tokens.numel()  # unique (expert, slot)
    per_expert = torch.bincount(r.experts, minlength=r.num_experts)
    assert (per_expert <= r.capacity).all()
    for expert in range(r.num_experts):  # an expert's slots are 0..n-1, so buffers pack densely
        slots = sorted(s for e, s in pairs if e == expert)
        assert slots == list(range(len(slots)))
    assert len(set(zip(r.tokens.tolist(), r.experts.tolist(), strict=True))) == r.tokens.numel()  # no duplicate route
    assert int(r.exp_counts.sum()) == logits.shape[0] * k
    if not drop:
        assert r.tokens.numel() == logits.shape[0] * k  # nothing dropped
        assert r.capacity == int(r.exp_counts.max())
    if drop:
        assert r.capacity >= min_capacity if k > 1 else True


@SETTINGS
@given(gate_cases())
def test_weights_sum_to_one_or_zero_and_the_dense_form_agrees(case):
    logits, k, factor, min_capacity, drop, seed = case
    r = route(logits, k, factor, min_capacity, drop, seed)
    per_token = torch.zeros(logits.shape[0]).index_add(0, r.tokens, r.weights)
    gates = torch.softmax(logits, dim=1)
    if k == 1:  # the raw gate value of the chosen expert
        assert torch.allclose(r.weights, gates[r.tokens, r.experts])
    else:
        routed = torch.zeros(logits.shape[0], dtype=torch.bool)
        routed[r.tokens] = True
        assert torch.allclose(per_token[routed], torch.ones(int(routed.sum())), atol=1e-5)
        assert (per_token[~routed] == 0).all()
    combine, dispatch = r.dense()
    assert combine.shape == (logits.shape[0], logits.shape[1], r.capacity)
    assert torch.allclose(combine.sum(dim=(1, 2)), per_token)
    assert torch.equal(dispatch, combine != 0)


@SETTINGS
@given(gate_cases())
def test_the_same_generator_state_gives_the_same_routing(case):
    logits, k, factor, min_capacity, drop, seed = case
    a = route(logits, k, factor, min_capacity, drop, seed)
    b = route(logits, k, factor, min_capacity, drop, seed)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.slots, b.slots) and torch.equal(a.weights, b.weights)
