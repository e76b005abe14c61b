"""What a model's config says about its shape: head counts, widths, vocabulary, tied embeddings.

Read from a Hugging Face config object or its config.json dict, with the several names model
families use for the same thing (n_head, num_heads, multi_query_group_num, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _first(config: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class ModelGeometry:
    model_type: str | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    base_model_tp_plan: dict[str, str] | None = None

    @classmethod
    def from_config(cls, config: Any) -> ModelGeometry:
        """From a Hugging Face PretrainedConfig (or its dict); None gives an empty geometry."""
        if config is None:
            return cls()
        text = _first(config, ("text_config",))
        if text is not None and _first(config, ("num_attention_heads", "n_head")) is None:
            config = text  # multimodal wrappers keep the language model's numbers here
        hidden = _first(config, ("hidden_size", "n_embd", "d_model"))
        heads = _first(config, ("num_attention_heads", "n_head", "num_heads"))
        kv = _first(config, ("num_key_value_heads", "multi_query_group_num", "num_kv_heads", "n_head_kv"))
        if kv is None and _first(config, ("multi_query",)) is True:
            kv = 1
        head_dim = _first(config, ("head_dim", "kv_channels"))
        if head_dim is None and hidden and heads:
            head_dim = hidden // heads
        plan = _first(config, ("base_model_tp_plan",))
        return cls(model_type=_first(config, ("model_type",)), hidden_size=hidden, num_attention_heads=heads,
                   num_key_value_heads=kv if kv is not None else heads, head_dim=head_dim,
                   intermediate_size=_first(config, ("intermediate_size", "ffn_hidden_size", "n_inner")),
                   vocab_size=_first(config, ("vocab_size", "padded_vocab_size")),
                   tie_word_embeddings=bool(_first(config, ("tie_word_embeddings",))),
                   base_model_tp_plan=dict(plan) if isinstance(plan, dict) and plan else None)
