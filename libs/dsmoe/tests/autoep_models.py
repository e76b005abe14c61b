"""Tiny Hugging Face MoE models for the AutoEP tests, built from configs (nothing downloaded)."""

import torch

VOCAB, HIDDEN, SEQ = 64, 16, 6


def _common(**extra):
    base = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=32, output_router_logits=True,
                router_aux_loss_coef=0.01, tie_word_embeddings=False)
    return {**base, **extra}


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(**_common(intermediate_size=32, num_local_experts=4,
                                                      num_experts_per_tok=2)))


def qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**_common(intermediate_size=32, moe_intermediate_size=16, num_experts=4,
                                                        num_experts_per_tok=2, norm_topk_prob=True, head_dim=8)))


def qwen2_moe_shared():
    """Qwen-MoE with a shared expert and its sigmoid gate (preset qwen3_moe covers it)."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**_common(intermediate_size=32, moe_intermediate_size=16, num_experts=4,
                                                        num_experts_per_tok=2, norm_topk_prob=False,
                                                        shared_expert_intermediate_size=24)))


def deepseek_v3(bias_seed: int = 7):
    """DeepSeek-V3 with group-limited sigmoid routing, a shared expert, a dense first layer and a
    non-zero e_score_correction_bias (a buffer in transformers 5)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**_common(
        intermediate_size=32, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
        topk_group=2, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        kv_lora_rank=8, q_lora_rank=None, num_key_value_heads=2, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_hidden_layers=3)))
    generator = torch.Generator().manual_seed(bias_seed)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.rand(buffer.shape, generator=generator) * 0.5)
    return model


def deepseek_v2():
    """DeepSeek-V2 with group-limited greedy routing (group max), scaled, unnormalised, a shared expert."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
    return DeepseekV2ForCausalLM(DeepseekV2Config(**_common(
        intermediate_size=32, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
        topk_group=2, topk_method="group_limited_greedy", n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.0, kv_lora_rank=8, q_lora_rank=None, num_key_value_heads=2, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, num_hidden_layers=3)))


def qwen3_5_moe():
    """The Qwen3.5-MoE text backbone (model type qwen3_5_moe_text): shared expert and gate."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**_common(
        moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
        head_dim=8, layer_types=["full_attention", "full_attention"])))


BUILDERS = {"mixtral": mixtral, "qwen3_moe": qwen3_moe, "qwen2_moe_shared": qwen2_moe_shared,
            "deepseek_v3": deepseek_v3, "deepseek_v2": deepseek_v2, "qwen3_5_moe": qwen3_5_moe}


def build(kind: str, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = BUILDERS[kind]()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # larger weights than HF's init, so routing is far from uniform
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.to(dtype)


def batch(seed: int, rows: int = 2):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, SEQ), generator=generator)
    return {"input_ids": ids, "labels": ids}
