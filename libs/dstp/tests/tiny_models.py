"""Tiny Hugging Face models built from configs (nothing downloaded), float64 for exact comparisons."""

import torch

FAMILIES = ("llama", "qwen2", "mixtral", "phi3")
MORE_FAMILIES = ("deepseek_v2", "bloom")  # the other presets the reference names, at TP 2
VOCAB, SEQ = 64, 8


def config(family: str, **extra):
    import transformers

    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common.update(extra)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "mixtral":
        return transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **common)
    if family == "phi3":
        return transformers.Phi3Config(**common)
    if family == "deepseek_v2":
        return transformers.DeepseekV2Config(**{**common, "num_key_value_heads": 4}, moe_intermediate_size=16,
                                             n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                             first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
                                             qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)
    if family == "bloom":
        return transformers.BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=VOCAB, tie_word_embeddings=False,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    raise ValueError(family)


def model(family: str, seed: int = 0, dtype=torch.float64, **extra):
    import transformers

    torch.manual_seed(seed)
    # grouped_mm has no float64
    kwargs = {"experts_implementation": "eager"} if family in ("mixtral", "deepseek_v2") else {}
    built = transformers.AutoModelForCausalLM.from_config(config(family, **extra), dtype=dtype, **kwargs)
    return built.train()


def tokens(step: int, batch: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randint(3, VOCAB, (batch, SEQ), generator=gen)
