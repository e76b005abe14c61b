"""Routes as k rows of S (DeepSpeed's `sparse_routes` layout): `Routing.per_route`, and the gather dispatch over it
(`route_slots`, `encode_routes`, `decode_routes`) against the dense [S, E, C] einsum dispatch, with tokens dropped
and not."""

import pytest
import torch

from dsmoe import MoEError
from dsmoe.gating import decode_routes, encode_routes, route_slots, route_top1, route_top2, route_topk


def routings(seed):
    torch.manual_seed(seed)
    logits = torch.randn(16, 4)
    gen = torch.Generator().manual_seed(seed)
    return [
        (1, route_top1(logits, 1.0, 0, use_rts=False)),
        (1, route_top1(logits, 0.5, 0, generator=gen)),  # random token selection, tokens dropped
        (2, route_top2(logits, 0.5, 0, top2_2nd_expert_sampling=False)),
        (3, route_topk(logits, 3, 0.5, 0)),
        (3, route_topk(logits, 3, 1.0, 0, drop_tokens=False)),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_rebuild_the_dense_weights_and_the_gather_dispatch_equals_the_einsum(seed):
    for k, routing in routings(seed):
        experts, slots, weights = routing.per_route(k)
        assert experts.shape == slots.shape == weights.shape == (k, routing.num_tokens)
        assert experts.dtype == slots.dtype == torch.int32
        dropped = experts < 0
        assert int((~dropped).sum()) == routing.tokens.numel()
        assert bool((slots[dropped] == 0).all()) and bool((weights[dropped] == 0).all())
        # heaviest route first within each token
        assert bool((weights[:-1] >= weights[1:]).all())
        combine, dispatch = routing.dense()
        rebuilt = torch.zeros_like(combine)
        for e, c, w in zip(experts, slots, weights):
            one_hot_e = torch.nn.functional.one_hot(e.clamp_min(0).long(), routing.num_experts) * (e >= 0).unsqueeze(1)
            one_hot_c = torch.nn.functional.one_hot(c.long(), routing.capacity)
            rebuilt += torch.einsum("s,se,sc->sec", w, one_hot_e.float(), one_hot_c.float())
        torch.testing.assert_close(rebuilt, combine)

        hidden = torch.randn(routing.num_tokens, 8)
        places = route_slots(experts, slots, routing.num_experts, routing.capacity)
        assert bool((places[dropped] == routing.num_experts * routing.capacity).all())
        encoded = encode_routes(hidden, places, routing.num_experts, routing.capacity)
        torch.testing.assert_close(encoded, torch.einsum("sec,sm->ecm", dispatch.float(), hidden))
        expert_output = torch.randn_like(encoded)
        decoded = decode_routes(expert_output.view(-1, 8), places, weights, routing.num_tokens)
        torch.testing.assert_close(decoded, torch.einsum("sec,ecm->sm", combine, expert_output))


def test_weights_keep_their_gradient_and_bad_k_is_named():
    logits = torch.randn(8, 4, requires_grad=True)
    routing = route_topk(logits, 2, 1.0, 0)
    _, _, weights = routing.per_route(2)
    weights.sum().backward()
    assert logits.grad is not None
    with pytest.raises(MoEError, match="more than k=1"):
        routing.per_route(1)
    with pytest.raises(MoEError, match="positive integer"):
        routing.per_route(0)
