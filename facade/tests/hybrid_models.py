"""Tiny Hugging Face causal LMs and DeepSpeed-Chat-style LoRA for the Hybrid Engine's tests."""

import math

import torch
from torch import nn

VOCAB = 64


def llama(seed: int = 0, **extra):
    import transformers

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128,
                                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      **extra)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config)


def family(name: str, seed: int = 0):
    """A tiny causal LM of another family than Llama (the Hybrid Engine generates with the model's own generate)."""
    import transformers

    small = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    configs = {
        "opt": lambda: transformers.OPTConfig(hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
                                              max_position_embeddings=128, word_embed_proj_dim=32, **small),
        "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **small),
        "qwen2": lambda: transformers.Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=128, **small),
        "mistral": lambda: transformers.MistralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=2,
                                                      max_position_embeddings=128, **small),
    }
    config = configs[name]()
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config)


def prompts(rank: int, rows: int = 2, length: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randint(3, VOCAB, (rows, length), generator=gen)


def config(stage: int = 3, **hybrid) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "hybrid_engine": {"enabled": True, "max_out_tokens": 64, **hybrid}}


class LoRALinear(nn.Module):
    """DeepSpeed-Chat's LinearLayer_LoRA shape: weight, bias, lora_right_weight [in, r], lora_left_weight [r, out],
    fuse_lora_weight() / unfuse_lora_weight() and the fuse_lora flag."""

    def __init__(self, linear: nn.Linear, rank: int = 4, scaling: float = 0.5):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.lora_right_weight = nn.Parameter(torch.randn(linear.in_features, rank) / math.sqrt(rank))
        self.lora_left_weight = nn.Parameter(torch.randn(rank, linear.out_features) * 0.1)
        self.lora_scaling = scaling
        self.fuse_lora = False

    def fuse_lora_weight(self):
        if not self.fuse_lora:
            self.weight.data += self.lora_scaling * (self.lora_left_weight.t() @ self.lora_right_weight.t())
        self.fuse_lora = True

    def unfuse_lora_weight(self):
        if self.fuse_lora:
            self.weight.data -= self.lora_scaling * (self.lora_left_weight.t() @ self.lora_right_weight.t())
        self.fuse_lora = False

    def forward(self, x):
        out = nn.functional.linear(x, self.weight, self.bias)
        if self.fuse_lora:
            return out
        return out + (x @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling


def with_lora(model, names=("q_proj", "v_proj")):
    torch.manual_seed(5)
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if child_name in names and isinstance(child, nn.Linear):
                setattr(module, child_name, LoRALinear(child))
    return model


def merged(model):
    """A plain copy with every LoRA fused into its Linear, for reference generation."""
    import copy

    twin = copy.deepcopy(model)
    for module in twin.modules():
        if isinstance(module, LoRALinear):
            module.fuse_lora_weight()
    return twin
