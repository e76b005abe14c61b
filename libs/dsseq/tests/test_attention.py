"""DistributedAttention over 2 and 4 gloo ranks equals the local attention on the whole sequence, in float64
to 1e-10: the output of every rank's slice and the gradients of q, k and v. Both layouts, MHA and both
kinds of GQA split (key/value heads split over the ranks, or repeated to them), rotary embedding after the
exchange, a merged-heads output, and a Hugging Face attention function behind a small adapter."""

import pytest
import torch

import dscomm
from dscomm.testing import run_ranks
from dsseq import DistributedAttention, SequenceParallelError, apply_rotary

TOL = 1e-10
B, S, D = 2, 16, 4


def sdpa_in_layout(batch_dim_idx, merge_heads=False):
    """A local attention for q, k, v in the [b, s, h, d] (0) or [s, b, h, d] (1) layout, causal, with GQA."""

    def attention(q, k, v):
        to_bhsd = (lambda t: t.permute(0, 2, 1, 3)) if batch_dim_idx == 0 else (lambda t: t.permute(1, 2, 0, 3))
        q, k, v = to_bhsd(q), to_bhsd(k), to_bhsd(v)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, h, s, d]
        out = out.permute(0, 2, 1, 3) if batch_dim_idx == 0 else out.permute(2, 0, 1, 3)
        return out.reshape(*out.shape[:2], -1) if merge_heads else out

    return attention


def hf_sdpa_attention():
    """transformers' sdpa attention function as a local attention of [b, s, h, d] tensors (its output is
    [b, s, h, d] already, returned with its weights as a tuple)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Module:
        is_causal = True
        training = True

    def attention(q, k, v):
        module = Module()
        module.num_key_value_groups = q.shape[2] // k.shape[2]
        return sdpa_attention_forward(module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None)

    return attention


def rotary(seq):
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    emb = torch.cat((angles, angles), dim=-1)  # [s, d]
    return emb.cos()[None, :, None, :].expand(B, seq, 1, D), emb.sin()[None, :, None, :].expand(B, seq, 1, D)


CASES = [  # (batch_dim_idx, query heads, key/value heads, rotary, merged-heads output, HF function)
    (1, 8, 8, False, False, False),
    (0, 8, 8, False, False, False),
    (1, 8, 4, True, False, False),
    (0, 8, 2, False, True, False),
    (0, 8, 2, True, False, True),
]


def compare(rank, world, cases):
    sequence = dscomm.ParallelDims(world, sequence=world).build().sequence
    worst = []
    for index, (bdim, hq, hkv, rope, merge, hf) in enumerate(cases):
        gen = torch.Generator().manual_seed(index)
        shape = (B, S) if bdim == 0 else (S, B)
        q, k, v = (torch.randn(*shape, h, D, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv))
        local = hf_sdpa_attention() if hf else sdpa_in_layout(bdim, merge)
        gather_idx = 1 - bdim  # the sequence dimension
        # Reference: the local attention over the whole sequence (rotary applied before it).
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        rq, rk = whole[0], whole[1]
        if rope:
            cos, sin = rotary(S)
            if bdim == 1:
                cos, sin = cos.transpose(0, 1), sin.transpose(0, 1)
            rq, rk = apply_rotary(rq, cos, sin), apply_rotary(rk, cos, sin)
        ref = local(rq, rk, whole[2])
        ref = ref[0] if isinstance(ref, tuple) else ref
        weight = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        (ref * weight).sum().backward()
        # Sequence parallel: this rank's slice in, its slice out.
        mine = [t.chunk(world, dim=gather_idx)[rank].clone().requires_grad_() for t in (q, k, v)]
        attn = DistributedAttention(local, sequence, scatter_idx=2, gather_idx=gather_idx)
        out = attn(*mine, bdim, rotary(S) if rope else None)
        out = out[0] if isinstance(out, tuple) else out
        (out * weight.chunk(world, dim=gather_idx)[rank]).sum().backward()
        diffs = [(out - ref.chunk(world, dim=gather_idx)[rank]).abs().max().item()]
        diffs += [(m.grad - w.grad.chunk(world, dim=gather_idx)[rank]).abs().max().item() for m, w in zip(mine, whole)]
        worst.append(max(diffs))
    return worst


@pytest.mark.parametrize("world", [2, 4])
def test_equals_local_attention_on_the_whole_sequence(world):
    results = run_ranks(compare, world, CASES, timeout=180)
    for rank, worst in enumerate(results):
        assert max(worst) < TOL, (rank, worst)


def refusals(rank, world):
    sequence = dscomm.ParallelDims(world, sequence=world).build().sequence
    attn = DistributedAttention(sdpa_in_layout(1), sequence)
    messages = []
    for hq, hkv in ((6, 6), (4, 3), (12, 3)):
        q, kv = torch.zeros(S // world, B, hq, D), torch.zeros(S // world, B, hkv, D)
        try:
            attn(q, kv, kv, 1)
        except SequenceParallelError as exc:
            messages.append(str(exc))
    return messages


def test_uneven_heads_are_refused_with_the_numbers():
    messages = run_ranks(refusals, 4, timeout=90)[0]
    assert "6 query heads do not split evenly over sequence-parallel size 4" in messages[0]
    assert "4 query heads are not a multiple of 3 key/value heads" in messages[1]
    assert "3 key/value heads neither split over nor divide sequence-parallel size 4" in messages[2]


def test_arguments_are_checked_at_construction():
    with pytest.raises(SequenceParallelError, match="sp_stream"):
        DistributedAttention(sdpa_in_layout(1), None, sp_stream=object())
    with pytest.raises(SequenceParallelError, match="scatter_idx and gather_idx are both 2"):
        DistributedAttention(sdpa_in_layout(1), None, scatter_idx=2, gather_idx=2)
    with pytest.raises(SequenceParallelError, match="must be callable"):
        DistributedAttention("sdpa", None)


def graph_operators(rank, world):
    import dsseq

    group = dscomm.ParallelDims(world, sequence=world).build().sequence
    name = dsseq.ops.group_name(group)
    x = torch.randn(2, 8, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(rank)).requires_grad_()
    y = x.detach().clone().requires_grad_()
    weight = torch.randn(2, 4, 12, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (torch.ops.dsseq.all_to_all(x, 1, 2, name) * weight).sum().backward()
    (dsseq.all_to_all(y, 1, 2, group) * weight).sum().backward()
    total = torch.ops.dsseq.sum_over_ranks(x.detach()[0, 0, 0, 0].clone().requires_grad_(), name)
    return (x.grad - y.grad).abs().max().item(), total.item()


def test_the_graph_operators_are_the_autograd_functions():
    results = run_ranks(graph_operators, 2, timeout=90)
    assert all(diff == 0.0 for diff, _ in results)
    assert results[0][1] == results[1][1]  # the same sum on every rank
