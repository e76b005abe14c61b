"""AutoSP trains as one rank on the whole sequence: the compiled graph cuts the sequence, the pass puts the
all-to-alls around every attention, positions and the loss are the whole sequence's. Tiny Llama (two layers,
key/value heads split over 2 ranks), Qwen2 and Mistral (one key/value head, repeated), float64: the loss and
every gradient (averaged over the sequence ranks, as ZeRO's sequence x data group does) against one rank.
Each refusal names its cause. sp 2 x dp 2 on 4 ranks runs through the engine (facade/tests/test_compile_passes.py).
aot_eager keeps compile time down; the pass runs before the backend, so inductor sees the same graph."""

import copy

import pytest
import tiny_models
import torch
import torch.distributed as dist

import dscomm
from dscomm.testing import run_ranks
from dsseq import SequenceParallelError, compile_autosp, prepare_autosp_inputs, uncompile_autosp

SEQ = 16


@pytest.fixture(autouse=True, scope="module")
def _modeling_code_loaded_before_forking():
    tiny_models.warm("llama", "qwen2", "mistral")
    _warm_compiler()


def sample(index, batch=1):
    ids = tiny_models.tokens(index, batch=batch, seq=SEQ)
    labels = ids.clone()
    labels[:, : SEQ // 2 + 3] = -100  # a prompt: rank 0's half holds no label at all
    return ids, labels


def reference_grads(model, ids, labels):
    loss = tiny_models.whole_sequence_loss(model, ids, labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return loss.item(), grads


def worst_gap(model, ref_loss, ref_grads, loss, group, world):
    worst = abs(loss.item() - ref_loss)
    for name, param in model.named_parameters():
        dscomm.all_reduce(param.grad, group=group)
        param.grad /= world
        worst = max(worst, (param.grad - ref_grads[name]).abs().max().item() / ref_grads[name].abs().max().item())
    model.zero_grad()
    return worst


def sp2_families_and_refusals(rank, world):
    torch.set_num_threads(1)
    gaps, refusals = {}, {}
    # The graph operator's fake kernel (shapes and strides, as inductor checks them) and gradient registration:
    x = torch.randn(2, 4, 6, 8, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.dsseq.all_to_all.default, (x, 1, 2, dist.group.WORLD.group_name))
    torch.library.opcheck(torch.ops.dsseq.sum_over_ranks.default, (x, dist.group.WORLD.group_name))
    for family, extra in (("llama", {}), ("qwen2", {"num_hidden_layers": 1}),
                          ("mistral", {"num_hidden_layers": 1, "num_key_value_heads": 1})):
        model = tiny_models.model(family, **extra)
        ref_loss, ref_grads = reference_grads(copy.deepcopy(model), *sample(0))
        runtime = compile_autosp(model, dist.group.WORLD, backend="aot_eager")
        ids, labels, pos, mask = prepare_autosp_inputs(*sample(0), attention_mask=torch.ones(1, SEQ, dtype=torch.long))
        assert mask is None
        loss = model(input_ids=ids, labels=labels, position_ids=pos).loss
        loss.backward()
        gaps[family] = worst_gap(model, ref_loss, ref_grads, loss, None, world)
        assert runtime.attention_per_graph and sum(runtime.attention_per_graph) == model.config.num_hidden_layers
        if family == "llama":
            with pytest.raises(SequenceParallelError) as err:
                model(input_ids=sample(1)[0], labels=sample(1)[1])
            refusals["not prepared"] = str(err.value)
            ids, labels, pos, _ = prepare_autosp_inputs(*(t[:, :SEQ - 1] for t in sample(1)))
            with pytest.raises(SequenceParallelError) as err:
                model(input_ids=ids, labels=labels, position_ids=pos)
            refusals["length"] = str(err.value)
            uncompile_autosp(runtime)
            assert model.forward.__self__ is model  # its own forward again
    with pytest.raises(SequenceParallelError) as err:
        prepare_autosp_inputs(*sample(0), attention_mask=torch.tensor([[0] * 2 + [1] * (SEQ - 2)]))
    refusals["padding"] = str(err.value)
    eager = tiny_models.model("llama", num_hidden_layers=1, attn_implementation="eager")
    compile_autosp(eager, dist.group.WORLD, backend="aot_eager")
    with pytest.raises(SequenceParallelError) as err:
        eager(**dict(zip(("input_ids", "labels", "position_ids"), prepare_autosp_inputs(*sample(0))[:3])))
    refusals["no attention"] = str(err.value)
    # 3 heads cannot split over 2 ranks:
    odd = tiny_models.model("llama", num_hidden_layers=1, hidden_size=24, num_attention_heads=3, num_key_value_heads=3)
    compile_autosp(odd, dist.group.WORLD, backend="aot_eager")
    with pytest.raises(SequenceParallelError) as err:
        odd(**dict(zip(("input_ids", "labels", "position_ids"), prepare_autosp_inputs(*sample(0))[:3])))
    refusals["heads"] = str(err.value)
    return gaps, refusals


def test_autosp_sp2_equals_one_rank_and_refuses_by_cause():
    gaps, refusals = run_ranks(sp2_families_and_refusals, 2, timeout=600)[0]
    assert all(gap < 1e-9 for gap in gaps.values()), gaps
    assert "input_ids was not prepared" in refusals["not prepared"]
    assert "sequence length 15" in refusals["length"] and "multiple of 2" in refusals["length"]
    assert "attention_mask has padding" in refusals["padding"]
    assert "found no scaled-dot-product attention" in refusals["no attention"]
    assert "LlamaForCausalLM" in refusals["no attention"]
    assert "3 query heads" in refusals["heads"] and "size 2" in refusals["heads"]


def _warm_compiler():
    """torch.compile once here before forking ranks: each rank's first compile would otherwise spend most of its
    time loading and priming dynamo and AOT autograd. No process group exists here; the ranks inherit warm caches."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
    torch.compile(model, backend="aot_eager")(torch.randint(0, 8, (2, 3))).sum().backward()
    torch._dynamo.reset()
