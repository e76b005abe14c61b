"""Built-in rules for the model families the reference names (tensor_parallel.preset_model).

Each preset covers the parameter names of the Hugging Face classes (transformers 5: fused 3-D expert
weights `mlp.experts.gate_up_proj` / `down_proj`) and the older per-expert Linear names DeepSpeed's
presets use. Where a fused weight's sub-parameters differ in size (Phi-3's QKV under grouped-query
attention), the sizes come from the model's config, so each rank keeps whole query and key/value heads.
"""

from __future__ import annotations

from .errors import TensorParallelError
from .geometry import ModelGeometry
from .specs import LayerSpec

PRESETS = ("llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3")


def _spec(patterns: list[str], kind: str, name: str, **extra) -> LayerSpec:
    return LayerSpec(patterns=tuple(patterns), partition_type=kind, source=f"preset {name}", **extra)


def _attention(name: str) -> list[LayerSpec]:
    return [_spec([r".*\.self_attn\.o_proj\.weight$"], "row", name),
            _spec([r".*\.self_attn\.[qkv]_proj\.(weight|bias)$"], "column", name)]


def _dense_mlp(name: str, prefix: str = r".*\.mlp") -> list[LayerSpec]:
    return [_spec([prefix + r"\.down_proj\.weight$"], "row", name),
            _spec([prefix + r"\.(gate|up)_proj\.weight$"], "column", name)]


def _fused_experts(name: str, prefix: str = r".*\.mlp\.experts") -> list[LayerSpec]:
    # transformers 5 keeps all experts in 3-D tensors: gate_up_proj (E, 2I, H) holds gate and up halves.
    return [_spec([prefix + r"\.gate_up_proj$"], "column", name, packed=2),
            _spec([prefix + r"\.up_proj$"], "column", name),
            _spec([prefix + r"\.down_proj$"], "row", name)]


def _qkv_shape(geometry: ModelGeometry) -> tuple:
    heads, kv, head_dim = geometry.num_attention_heads, geometry.num_key_value_heads, geometry.head_dim
    if heads and kv and head_dim and kv != heads:
        return ((heads * head_dim, kv * head_dim, kv * head_dim), -1)  # grouped-query: unequal Q, K, V
    return (3, -1)


def preset_specs(name: str, geometry: ModelGeometry | None = None, key: str = "tensor_parallel.preset_model"
                 ) -> list[LayerSpec]:
    """The rules of preset `name` for a model of `geometry`."""
    geometry = geometry or ModelGeometry()
    if name == "llama" or name == "qwen2":
        return [*_attention(name), *_dense_mlp(name)]
    if name == "mixtral":
        return [*_attention(name), *_fused_experts(name),
                _spec([r".*\.block_sparse_moe\.experts\.\d+\.w2\.weight$"], "row", name),
                _spec([r".*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$"], "column", name),
                _spec([r".*\.(mlp|block_sparse_moe)\.gate\.weight$"], "skip", name)]
    if name == "deepseek_v2":
        # Multi-head latent attention stays whole: its one rotary key feeds every head (see apply.py).
        return [_spec([r".*\.self_attn\..*"], "skip", name),
                *_fused_experts(name),
                *_dense_mlp(name, r".*\.mlp\.experts\.\d+"),
                *_dense_mlp(name, r".*\.mlp\.shared_experts"),
                _spec([r".*\.mlp\.gate\.weight$"], "skip", name),
                *_dense_mlp(name)]
    if name == "phi3":
        return [_spec([r".*\.self_attn\.o_proj\.weight$"], "row", name),
                _spec([r".*\.self_attn\.qkv_proj\.weight$"], "column", name, shape=_qkv_shape(geometry),
                      partition_dim=0),
                _spec([r".*\.mlp\.down_proj\.weight$"], "row", name),
                _spec([r".*\.mlp\.gate_up_proj\.weight$"], "column", name, shape=(2, -1), partition_dim=0)]
    if name == "bloom":
        # BLOOM interleaves [q, k, v] per head, so a contiguous split of the rows keeps whole heads.
        return [_spec([r".*\.self_attention\.dense\.weight$"], "row", name),
                _spec([r".*\.self_attention\.query_key_value\.(weight|bias)$"], "column", name),
                _spec([r".*\.mlp\.dense_4h_to_h\.weight$"], "row", name),
                _spec([r".*\.mlp\.dense_h_to_4h\.(weight|bias)$"], "column", name)]
    if name == "chatglm":
        return [_spec([r".*\.self_attention\.dense\.weight$"], "row", name),
                _spec([r".*\.self_attention\.query_key_value\.(weight|bias)$"], "column", name,
                      shape=_qkv_shape(geometry), partition_dim=0),
                _spec([r".*\.mlp\.dense_4h_to_h\.weight$"], "row", name),
                _spec([r".*\.mlp\.dense_h_to_4h\.weight$"], "column", name, shape=(2, -1), partition_dim=0)]
    raise TensorParallelError(f"{key} = {name!r}: not a preset; the presets are {', '.join(PRESETS)}")
