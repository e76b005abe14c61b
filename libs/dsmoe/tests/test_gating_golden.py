"""Gating cases worked out by hand: masks, slots, weights, capacities and the balancing loss."""

import math

import pytest
import torch

import dsmoe
from dsmoe import MoEError, top1gating, top2gating, topkgating


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def routes(combine: torch.Tensor) -> dict[tuple[int, int, int], float]:
    """{(token, expert, slot): weight} of the non-zero combine weights."""
    return {tuple(int(i) for i in index): float(combine[tuple(index)]) for index in combine.nonzero()}


def test_top1_routes_each_token_to_its_best_expert_in_sequence_slots():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0]])
    l_aux, combine, dispatch, counts = top1gating(logits, capacity_factor=1.0, min_capacity=0)
    # capacity = ceil(4 tokens / 2 experts x 1.0) = 2; weights are the raw gate probabilities
    assert combine.shape == (4, 2, 2)
    expected = {(0, 0, 0): sig(2), (1, 1, 0): sig(2), (2, 0, 1): sig(1), (3, 1, 1): sig(1)}
    assert routes(combine).keys() == expected.keys()
    for key, weight in expected.items():
        assert routes(combine)[key] == pytest.approx(weight, rel=1e-6)
    assert torch.equal(dispatch, combine != 0)
    assert counts.tolist() == [2, 2]
    # me = [0.5, 0.5] (each pair of rows sums to 1), ce = [0.5, 0.5]: 2 x (0.25 + 0.25) = 1
    assert l_aux.item() == pytest.approx(1.0, abs=1e-7)


def test_top1_first_come_keeps_the_earliest_tokens_without_rts():
    logits = torch.tensor([[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [4.0, 0.0]])  # all prefer expert 0
    l_aux, combine, _, counts = top1gating(logits, capacity_factor=1.0, min_capacity=0, use_rts=False)
    assert counts.tolist() == [4, 0]  # counted before the capacity drops anything
    assert routes(combine).keys() == {(0, 0, 0), (1, 0, 1)}  # capacity 2: tokens 0 and 1, in order
    me0 = (sig(3) + sig(2) + sig(1) + sig(4)) / 4
    assert l_aux.item() == pytest.approx(2 * me0 * 1.0, rel=1e-6)  # E x (me0 x ce0 + me1 x 0)


def test_top1_random_token_selection_keeps_the_highest_draws_of_its_generator():
    logits = torch.tensor([[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [4.0, 0.0]])
    draws = torch.rand(4, 2, generator=torch.Generator().manual_seed(7))[:, 0]
    kept = sorted(draws.argsort(descending=True)[:2].tolist())
    _, combine, _, _ = top1gating(logits, 1.0, 0, use_rts=True, generator=torch.Generator().manual_seed(7))
    # the kept tokens still take their slots in sequence order
    assert routes(combine).keys() == {(kept[0], 0, 0), (kept[1], 0, 1)}
    again = top1gating(logits, 1.0, 0, use_rts=True, generator=torch.Generator().manual_seed(7))[1]
    assert torch.equal(combine, again)


def test_top1_used_token_leaves_masked_tokens_unrouted():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0]])
    _, combine, _, counts = top1gating(logits, 1.0, 0, used_token=torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert counts.tolist() == [2, 1]
    assert {k[0] for k in routes(combine)} == {0, 2, 3}


def test_capacity_larger_than_the_token_count_and_min_capacity():
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    # ceil(3 / 2 x 4.0) = 6 slots per expert for 3 tokens: nothing is dropped, buffers are 6 deep
    _, combine, _, _ = top1gating(logits, capacity_factor=4.0, min_capacity=0)
    assert combine.shape == (3, 2, 6)
    assert routes(combine).keys() == {(0, 0, 0), (1, 1, 0), (2, 0, 1)}
    # min_capacity raises a small capacity: top-2 with 10 slots for 3 tokens
    _, combine2, _, _ = top2gating(logits, capacity_factor=0.1, min_capacity=10, top2_2nd_expert_sampling=False)
    assert combine2.shape == (3, 2, 10)
    assert (combine2.sum(dim=(1, 2)) - 1).abs().max() < 1e-6  # every token kept both routes


def test_top1_refuses_fewer_tokens_than_min_capacity_with_the_numbers():
    with pytest.raises(MoEError, match="3 tokens is fewer than min_capacity=4"):
        top1gating(torch.zeros(3, 2), 1.0, 4)


def test_top2_second_choices_queue_behind_first_choices_and_renormalise():
    logits = torch.tensor([[3.0, 2.0, 0.0], [0.0, 1.0, 3.0]])
    _, combine, _, counts = top2gating(logits, 1.0, 0, top2_2nd_expert_sampling=False)
    # capacity ceil(2 / 3 x 1.0 x 2) = 2; token 0: experts 0 then 1; token 1: experts 2 then 1
    assert combine.shape == (2, 3, 2)
    got = routes(combine)
    assert got.keys() == {(0, 0, 0), (0, 1, 0), (1, 2, 0), (1, 1, 1)}
    assert got[(0, 0, 0)] == pytest.approx(sig(1), rel=1e-6)  # e^3 / (e^3 + e^2)
    assert got[(0, 1, 0)] == pytest.approx(1 - sig(1), rel=1e-6)
    assert got[(1, 2, 0)] == pytest.approx(sig(2), rel=1e-6)  # e^3 / (e^3 + e^1)
    assert got[(1, 1, 1)] == pytest.approx(1 - sig(2), rel=1e-6)
    assert counts.tolist() == [1, 2, 1]


def test_top2_a_lone_surviving_route_weighs_one():
    logits = torch.tensor([[3.0, 2.0, 0.0], [0.0, 1.0, 3.0]])
    # capacity ceil(2 / 3 x 0.5 x 2) = 1: token 1's second route (expert 1, slot 1) is dropped
    _, combine, _, counts = top2gating(logits, 0.5, 0, top2_2nd_expert_sampling=False)
    got = routes(combine)
    assert got.keys() == {(0, 0, 0), (0, 1, 0), (1, 2, 0)}
    assert got[(1, 2, 0)] == pytest.approx(1.0, abs=1e-6)
    assert counts.tolist() == [1, 2, 1]  # counts are taken before the drop


def test_topk_probs_policy_keeps_the_most_probable_tokens():
    logits = torch.tensor([[0.0, 2.0, 0.5, 3.0], [0.0, 1.0, 3.0, 2.0], [3.0, 2.0, 1.0, 0.0], [0.0, 3.0, 1.5, 2.0]])
    # k = 3, capacity ceil(4 / 4 x 0.34 x 3) = 2. Every token chooses expert 2, with probabilities
    # 0.055 (token 0), 0.665 (token 1), 0.090 (token 2) and 0.136 (token 3).
    _, combine, _, counts = topkgating(logits, 3, 0.34, 0)
    assert combine.shape == (4, 4, 2)
    assert sorted(k[0] for k in routes(combine) if k[1] == 2) == [1, 3]
    assert counts.tolist() == [1, 4, 4, 3]
    sums = combine.sum(dim=(1, 2))
    assert torch.allclose(sums, torch.ones(4), atol=1e-6)  # renormalised over the surviving routes
    position = topkgating(logits, 3, 0.34, 0, drop_policy="position")[1]
    assert sorted(k[0] for k in routes(position) if k[1] == 2) == [0, 1]  # the first two in sequence


@pytest.mark.parametrize("k", [1, 2, 3])
def test_balanced_routing_gives_a_balancing_loss_of_exactly_one(k):
    experts, tokens = 4, 8
    logits = torch.zeros(tokens, experts)
    # token t prefers experts t, t+1, t+2 (mod 4) in that order: every expert is chosen equally often
    for t in range(tokens):
        for rank in range(k):
            logits[t, (t + rank) % experts] = 3.0 - rank
    l_aux = dsmoe.route_topk(logits, k, 2.0, 0).l_aux if k > 2 else (
        top1gating(logits, 2.0, 0)[0] if k == 1 else top2gating(logits, 2.0, 0, top2_2nd_expert_sampling=False)[0])
    assert l_aux.item() == pytest.approx(1.0, abs=1e-6)
    assert top1gating(torch.zeros(tokens, experts), 1.0, 0)[0].item() == pytest.approx(1.0, abs=1e-7)


def test_capacity_rounds_as_float32_does():
    # 25 tokens per expert x 1.2 is 30.0 in float64 but 30.000002 in float32: DeepSpeed's capacity is
    # 31; x 2.2 is 55.000000000000007 in float64 (56) but 55.0 in float32 (55)
    assert dsmoe.expert_capacity(50, 2, 1.2, 0) == 31
    assert dsmoe.expert_capacity(50, 2, 2.2, 0) == 55
    assert dsmoe.expert_capacity(512, 4, 1.25, 4) == 160
    assert dsmoe.expert_capacity(4, 4, 0.1, 4) == 4
