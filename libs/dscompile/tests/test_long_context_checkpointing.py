"""long_context_checkpointing on a tiny two-layer causal transformer compiled through AOT autograd: what
the pass tags (attention saved, sequence-long activations recomputed, one region per attention), that the
backward graph recomputes them, that losses and gradients equal the model's own, and that the activations
backward takes from forward shrink once the sequence reaches the threshold (and nothing changes below it)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

import dscompile
from dscompile.passes.long_context import is_attention, long_context_checkpointing

VOCAB, WIDTH, HEADS = 32, 16, 2


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, WIDTH)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def _train_once(model, backend, tokens, labels):
    torch._dynamo.reset()
    model.zero_grad()
    run = torch.compile(model, backend=backend, fullgraph=True) if backend else model
    loss = run(tokens, labels)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyLM().double()


def _batch(length):
    generator = torch.Generator().manual_seed(length)
    return (torch.randint(0, VOCAB, (1, length), generator=generator),
            torch.randint(0, VOCAB, (1, length), generator=generator))


def test_long_sequences_recompute_all_but_attention_with_equal_losses_and_gradients(model):
    tokens, labels = _batch(64)
    loss, grads = _train_once(model, None, tokens, labels)
    backend = dscompile.long_context_backend("aot_eager", min_seq_len=32, keep_graphs=True)
    compiled_loss, compiled_grads = _train_once(model, backend, tokens, labels)

    (plan,), ((joint, backward),) = backend.partitioner.plans, backend.partitioner.graphs
    assert plan.active and plan.attention == 2 and plan.longest == 64
    nodes = {n.name: n for n in joint.nodes}
    attention = [n for n in nodes.values() if is_attention(n)]
    assert len(attention) == 2 and all(n.meta["recompute"] == CheckpointPolicy.MUST_SAVE for n in attention)
    assert len(plan.recomputed) >= 20  # norms, projections, MLPs, logits: every sequence-long value
    regions = sorted({nodes[name].meta["ac_graph_id"] for name in plan.recomputed})
    assert regions == [1, 2, 3]  # before, between and after the two attention calls
    # parameters alone (the weights' transposes) are never tagged
    assert not any(str(nodes[name].target) == "aten.t.default" for name in plan.recomputed)
    # visible in the backward graph: the tagged forward nodes it computes again
    again = [n.name for n in backward.nodes if n.name in set(plan.recomputed)]
    assert any(name.startswith("addmm") for name in again) and any(name.startswith("gelu") for name in again)
    assert not any(is_attention(n) for n in backward.nodes)  # attention is not run again

    torch.testing.assert_close(compiled_loss, loss, rtol=1e-12, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-10, atol=1e-13, msg=name)


def test_saved_activation_memory_drops_from_the_threshold_and_nothing_changes_below(model):
    def saved(length, min_seq_len):
        backend = dscompile.long_context_backend("aot_eager", min_seq_len=min_seq_len, keep_graphs=True)
        _train_once(model, backend, *_batch(length))
        (plan,), (nbytes,), ((joint, _),) = (backend.partitioner.plans, backend.partitioner.saved_bytes,
                                             backend.partitioner.graphs)
        return plan, nbytes, joint

    plan_on, with_pass, _ = saved(128, 128)
    plan_off, without, joint = saved(128, 129)  # one token short of the threshold: the partitioner's own choice
    assert plan_on.active and not plan_off.active and not plan_off.saved and plan_off.longest == 128
    assert not any("recompute" in n.meta or "ac_graph_id" in n.meta for n in joint.nodes)
    assert with_pass <= 0.6 * without, (with_pass, without)


def test_refusals_name_the_setting():
    with pytest.raises(dscompile.DeepCompileError, match=r"min_seq_len must be a positive int.*got 0"):
        dscompile.long_context_backend("aot_eager", min_seq_len=0)
    with pytest.raises(dscompile.DeepCompileError, match=r"backend 'eager' has none.*inductor"):
        dscompile.long_context_backend("eager")
    with pytest.raises(dscompile.DeepCompileError, match="got True"):
        long_context_checkpointing(torch.fx.Graph(), min_seq_len=True)
    assert not long_context_checkpointing(torch.fx.Graph(), min_seq_len=8).active  # no attention: nothing


def test_a_model_that_checkpoints_itself_is_left_to_its_own_regions(model):
    class Checkpointed(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, tokens, labels):
            return torch.utils.checkpoint.checkpoint(self.inner, tokens, labels, use_reentrant=False)

    backend = dscompile.long_context_backend("aot_eager", min_seq_len=8)
    _train_once(Checkpointed(model), backend, *_batch(16))
    (plan,) = backend.partitioner.plans
    assert plan.already_checkpointed and not plan.active
