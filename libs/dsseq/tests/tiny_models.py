"""Tiny Hugging Face causal LMs built from configs (nothing downloaded), float64 for exact comparisons."""

import torch

VOCAB = 64


def config(family: str, **extra):
    import transformers

    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    common.update(extra)
    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}
    return classes[family](**common)


def model(family: str = "llama", seed: int = 0, dtype=torch.float64, **extra):
    import transformers

    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config(family, **extra), dtype=dtype).train()


def tokens(seed: int, batch: int = 1, seq: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + seed)
    return torch.randint(3, VOCAB, (batch, seq), generator=gen)


def whole_sequence_loss(model, ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """The causal-LM loss of the whole sequence in the model's dtype (Hugging Face's own upcasts to float32)."""
    labels = ids if labels is None else labels
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                             ignore_index=-100)


def warm(*families: str) -> None:
    """Import each family's modeling code in this process, so ranks forked from it do not each do it."""
    for family in families:
        model(family, num_hidden_layers=1)
