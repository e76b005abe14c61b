"""Which parameters Muon takes and which it splits per head (dstrain.ops.muon_params), on tiny Hugging Face
models built from transformers configs (nothing downloaded): Llama with GQA and DeepSeek-V3 with MLA;
per-head Muon equals Newton-Schulz run on each head's slice by hand; conflicts are skipped with a
warning; under tensor parallelism (dstp) the head count is re-resolved on each shard."""

import math
import warnings

import pytest
import torch
from engine_models import make_model

import dsconfig
import dstp
from dscomm.testing import run_ranks
from dstrain.engine.optim_factory import build_optimizer
from dstrain.ops import Muon
from dstrain.ops.muon import newton_schulz_gram, newton_schulz_standard
from dstrain.ops.muon_params import select_muon_parameters, tag_attention_heads

transformers = pytest.importorskip("transformers")


def tiny_llama(**overrides):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, **overrides)
    return transformers.LlamaForCausalLM(config)


def tiny_deepseek(q_lora_rank=16):
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, q_lora_rank=q_lora_rank, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, n_group=1, topk_group=1)
    return transformers.DeepseekV3ForCausalLM(config)


def tagged(model):
    select_muon_parameters(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tags = tag_attention_heads(model)
    return tags, [str(w.message) for w in caught]


def test_llama_gqa_tags_q_by_query_heads_and_k_v_by_kv_heads():
    model = tiny_llama()
    tags, warned = tagged(model)
    expected = {}
    for layer in range(2):
        prefix = f"model.layers.{layer}.self_attn."
        expected.update({prefix + "q_proj.weight": 4, prefix + "k_proj.weight": 2, prefix + "v_proj.weight": 2})
    assert tags.tagged == expected and not warned
    heads = {n: p.muon_num_heads for n, p in model.named_parameters() if hasattr(p, "muon_num_heads")}
    assert heads == expected  # o_proj, gate/up/down_proj, embeddings and the head carry nothing
    muon = {n for n, p in model.named_parameters() if p.use_muon}
    assert muon == {n for n, p in model.named_parameters()
                    if p.ndim == 2 and "embed_tokens" not in n and n != "lm_head.weight"}


def test_deepseek_mla_tags_the_up_projections_only():
    tags, warned = tagged(tiny_deepseek())
    expected = {}
    for layer in range(2):
        prefix = f"model.layers.{layer}.self_attn."
        expected.update({prefix + "q_b_proj.weight": 4, prefix + "kv_b_proj.weight": 4})
    assert tags.tagged == expected and not warned  # not q_a_proj, kv_a_proj_with_mqa, o_proj
    # Without a query LoRA the query projection is q_proj, split by qk_nope + qk_rope.
    tags, _ = tagged(tiny_deepseek(q_lora_rank=None))
    assert tags.tagged["model.layers.0.self_attn.q_proj.weight"] == 4
    assert "model.layers.0.self_attn.q_b_proj.weight" not in tags.tagged


def test_geometries_that_disagree_on_the_head_count_are_skipped_with_a_warning():
    # head_dim 16 but hidden / heads = 8: k_proj's 32 rows fit 2 heads x 16 and 4 heads x 8.
    tags, warned = tagged(tiny_llama(head_dim=16))
    assert tags.tagged["model.layers.0.self_attn.q_proj.weight"] == 4  # 64 rows: only 4 x 16 fits
    assert "model.layers.0.self_attn.k_proj.weight" in tags.conflicts
    assert "model.layers.0.self_attn.k_proj.weight" not in tags.tagged
    assert any("different head counts" in w and "k_proj" in w for w in warned)


def test_a_shape_the_config_does_not_confirm_stays_whole_and_nothing_tagged_is_refused_by_key():
    model = tiny_llama()
    attention = model.model.layers[0].self_attn
    attention.q_proj.weight = torch.nn.Parameter(torch.randn(40, 32))  # 40 rows: no heads x width of the config
    tags, warned = tagged(model)
    assert "model.layers.0.self_attn.q_proj.weight" in tags.unconfirmed
    assert any("confirms no head geometry" in w for w in warned)
    config = dsconfig.OptimizerConfig("Muon", {"lr": 0.01, "per_head_muon": True})
    with pytest.raises(dsconfig.ConfigError) as info:
        tiny = make_model()
        build_optimizer(config, tiny.parameters(), model=tiny)  # no config, no attention: nothing to split
    assert info.value.paths == ["optimizer.params.per_head_muon"]


@pytest.mark.parametrize("ns_method", ["gram", "standard"])
def test_per_head_muon_equals_newton_schulz_on_each_head_by_hand(ns_method):
    model = tiny_llama()
    config = dsconfig.OptimizerConfig("Muon", {"lr": 0.1, "momentum": 0.0, "per_head_muon": True,
                                               "ns_method": ns_method})
    optimizer = build_optimizer(config, model.parameters(), model=model)
    k_proj = model.model.layers[0].self_attn.k_proj.weight  # 2 KV heads of 8 rows, 32 inputs
    o_proj = model.model.layers[0].self_attn.o_proj.weight  # whole
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = {name: (p.detach().clone(), p.grad.clone()) for name, p in (("k", k_proj), ("o", o_proj))}
    optimizer.step()
    ns = newton_schulz_gram if ns_method == "gram" else newton_schulz_standard
    weight, grad = before["k"]
    by_hand = torch.cat([ns(grad[8 * h:8 * (h + 1)]) for h in range(2)])  # scale sqrt(max(1, 8/32)) = 1
    torch.testing.assert_close(k_proj.detach(), weight - 0.1 * by_hand)
    weight, grad = before["o"]
    torch.testing.assert_close(o_proj.detach(), weight - 0.1 * ns(grad) * math.sqrt(max(1.0, 32 / 32)))
    assert not torch.allclose(by_hand, ns(before["k"][1]))  # per head differs from the whole matrix


def tp_rank(rank, world):
    import dscomm

    groups = dscomm.ParallelDims(world, tensor=world).build()
    model = tiny_llama()
    dstp.parallelize(model, groups.tensor)
    tags, _ = tagged(model)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n in tags.tagged}
    return tags.tagged, shapes


def test_tensor_parallel_shards_re_resolve_their_head_count():
    per_rank = run_ranks(tp_rank, 2, timeout=120)
    for found, shapes in per_rank:
        prefix = "model.layers.0.self_attn."
        # Each rank holds half the heads: 2 query heads and 1 KV head of width 8.
        assert found[prefix + "q_proj.weight"] == 2 and shapes[prefix + "q_proj.weight"] == (16, 32)
        assert found[prefix + "k_proj.weight"] == 1 and found[prefix + "v_proj.weight"] == 1


def test_a_use_muon_set_by_hand_is_kept_and_muon_groups_follow_the_rule():
    model = tiny_llama()
    model.model.layers[0].mlp.down_proj.weight.use_muon = False
    optimizer = build_optimizer(dsconfig.OptimizerConfig("Muon", {"lr": 0.02, "adam_lr": 0.003}),
                                model.parameters(), model=model)
    muon = {id(p) for g in optimizer.param_groups if g["use_muon"] for p in g["params"]}
    adam = {id(p) for g in optimizer.param_groups if not g["use_muon"] for p in g["params"]}
    for param in (model.model.embed_tokens.weight, model.lm_head.weight, model.model.layers[0].mlp.down_proj.weight,
                  model.model.norm.weight):
        assert id(param) in adam
    assert id(model.model.layers[1].mlp.down_proj.weight) in muon
    assert [g["lr"] for g in optimizer.param_groups] == [0.02, 0.003] and isinstance(optimizer, Muon)


def init_rank(rank, world):
    import dszero

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = torch.nn.Linear(32, 32, bias=False), torch.nn.Linear(32, 16, bias=False)
            self.v_proj, self.o_proj = torch.nn.Linear(32, 16, bias=False), torch.nn.Linear(32, 32, bias=False)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
            self.embed_tokens, self.self_attn = torch.nn.Embedding(64, 32), Attention()

    with dszero.Init():
        model = Model()
    tags, _ = tagged(model)
    return tags.tagged, {n: bool(p.use_muon) for n, p in model.named_parameters()}, model.self_attn.q_proj.weight.numel()


def test_parameters_built_inside_zero_init_are_tagged_by_their_whole_shape():
    found, muon, held = run_ranks(init_rank, 2, timeout=120)[0]
    assert held < 32 * 32  # partitioned: the rank holds a shard, not the [32, 32] matrix
    assert found == {"self_attn.q_proj.weight": 4, "self_attn.k_proj.weight": 2, "self_attn.v_proj.weight": 2}
    assert muon == {"embed_tokens.weight": False, "self_attn.q_proj.weight": True, "self_attn.k_proj.weight": True,
                    "self_attn.v_proj.weight": True, "self_attn.o_proj.weight": True}
