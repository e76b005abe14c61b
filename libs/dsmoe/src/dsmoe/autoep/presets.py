"""Built-in AutoEP presets: where a model family keeps its MoE blocks, routers and expert weights, and
how it routes (the `expert_parallel.preset_model` values of the config reference).

A preset names direct child attributes (router, experts, shared experts), not regexes; only
`moe_layer_pattern` is a regex over module names. Routing defaults that a model's config may
override are read from it by attribute (`norm_topk_prob`, `routed_scaling_factor`, `n_group`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

ScoreFunc = str  # "softmax" | "sigmoid"
GroupScore = str  # "max" (DeepSeek-V2) | "top2_sum" (DeepSeek-V3)


@dataclass(frozen=True)
class Preset:
    name: str
    model_types: tuple[str, ...]  # model.config.model_type values that pick this preset
    moe_layer_pattern: str  # regex, full match over module names
    router: str
    experts: str
    w1: str  # gate projection, or fused gate+up when w3 is None
    w2: str  # down projection
    w3: str | None
    num_experts_attr: str
    top_k_attr: str
    score_func: ScoreFunc
    route_norm: bool  # default when the model's config does not say (norm_attr)
    norm_attr: str | None = "norm_topk_prob"  # None: the family never renormalises, whatever its config holds
    scaling_attr: str | None = None  # model.config attribute of routed_scaling_factor
    group_score: GroupScore | None = None  # group-limited routing, with the groups from groups_attr
    groups_attr: str | None = None
    limited_groups_attr: str | None = None
    groups_method: str | None = None  # groups only when model.config.topk_method is this (DeepSeek-V2)
    group_mask_value: float = float("-inf")  # what scores of unchosen groups become before top-k
    shared_experts: str | None = None  # child name; used when the block has it
    shared_experts_gate: str | None = None  # sigmoid gate of the shared experts' output (Qwen)
    correction_bias: str | None = None  # router attribute added to the scores for the choice only


_MOE_MLP = r"model\.layers\.\d+\.mlp"

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (
    Preset("mixtral", ("mixtral",), _MOE_MLP, "gate", "experts", "gate_up_proj", "down_proj", None,
           "num_local_experts", "num_experts_per_tok", "softmax", route_norm=True, norm_attr=None),
    Preset("qwen3_moe", ("qwen3_moe", "qwen2_moe"), _MOE_MLP, "gate", "experts", "gate_up_proj", "down_proj", None,
           "num_experts", "num_experts_per_tok", "softmax", route_norm=False, shared_experts="shared_expert",
           shared_experts_gate="shared_expert_gate"),
    Preset("qwen3_5_moe", ("qwen3_5_moe_text", "qwen3_5_moe"), r"(model\.)?(language_model\.)?layers\.\d+\.mlp",
           "gate", "experts", "gate_up_proj", "down_proj", None, "num_experts", "num_experts_per_tok", "softmax",
           route_norm=True, shared_experts="shared_expert", shared_experts_gate="shared_expert_gate"),
    Preset("deepseek_v2", ("deepseek_v2",), _MOE_MLP, "gate", "experts", "gate_up_proj", "down_proj", None,
           "n_routed_experts", "num_experts_per_tok", "softmax", route_norm=False, norm_attr=None,
           scaling_attr="routed_scaling_factor", group_score="max", groups_attr="n_group",
           limited_groups_attr="topk_group", groups_method="group_limited_greedy", group_mask_value=0.0, shared_experts="shared_experts"),
    Preset("deepseek_v3", ("deepseek_v3",), _MOE_MLP, "gate", "experts", "gate_up_proj", "down_proj", None,
           "n_routed_experts", "num_experts_per_tok", "sigmoid", route_norm=True,
           scaling_attr="routed_scaling_factor", group_score="top2_sum", groups_attr="n_group",
           limited_groups_attr="topk_group", shared_experts="shared_experts",
           correction_bias="e_score_correction_bias"),
)}


def preset_for_model_type(model_type: str | None) -> Preset | None:
    for preset in PRESETS.values():
        if model_type in preset.model_types:
            return preset
    return None
