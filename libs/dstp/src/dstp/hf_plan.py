"""A Hugging Face model's tensor-parallel plan (`config.base_model_tp_plan`, and the model's own `_tp_plan`)
as partition rules.

HF writes module paths relative to the base model with `*` for a layer index
("layers.*.self_attn.q_proj": "colwise"); a rule here matches the module's weight (its bias follows
it) or a parameter of that name (3-D expert weights).
"""

from __future__ import annotations

import re
from typing import Any

from .errors import TensorParallelError
from .specs import LayerSpec

# style -> (partition_type, LayerSpec keyword arguments)
STYLES: dict[str, tuple[str, dict]] = {
    "colwise": ("column", {}),
    "colwise_rep": ("column", {"gather_output": True}),  # the older name of colwise_gather_output
    "colwise_gather_output": ("column", {"gather_output": True}),
    "rowwise": ("row", {}),
    "rowwise_split_input": ("row", {"split_input": True}),  # the input arrives whole: the row layer takes its slice
    "packed_colwise": ("column", {"packed": 2}),
    "replicated_with_grad_allreduce": ("skip", {"grad_allreduce": True}),
    "embedding_rowwise": ("skip", {}),  # the embedding stays whole (a vocabulary-parallel embedding is not here)
}
# A module whose own weights are split (an experts block) all-reduces its output; dstp infers that.
INFERRED_STYLES = frozenset({"moe_tp_experts"})


def hf_tp_plan(model: Any) -> dict[str, str] | None:
    """The plan a Hugging Face model carries, merged as transformers keeps it: `config.base_model_tp_plan`
    (paths inside the base model), then the class's `_tp_plan` (the model-level entries, "lm_head"), then
    the instance's `_tp_plan` (transformers' post_init replaces it with the base plan under a "model."
    prefix, which may drop the class's entries: they are kept). A "model."-prefixed path whose unprefixed
    form is already in is left out, so a rule is written once. None when none of them has an entry."""
    config = getattr(model, "config", None)
    instance = getattr(model, "__dict__", {})
    sources = (getattr(config, "base_model_tp_plan", None) if config is not None else None,
               getattr(type(model), "_tp_plan", None), instance.get("_tp_plan"))
    merged: dict[str, str] = {}
    known: set[str] = set()
    for plan in sources:
        if not isinstance(plan, dict):
            continue
        for path, style in plan.items():
            bare = path[len("model."):] if path.startswith("model.") else path
            if bare != path and bare in known:
                continue
            merged[path] = style
            known.add(bare)
    return merged or None


def hf_pattern(path: str) -> str:
    """'layers.*.mlp.down_proj' -> a regex for its weight (and itself, for a parameter path)."""
    body = r"\.".join(r"[^.]+" if part == "*" else re.escape(part) for part in path.split("."))
    return rf"(?:.*\.)?{body}(?:\.weight)?$"


def unsupported_styles(plan: dict[str, str]) -> dict[str, str]:
    """{path: style} of every entry dstp cannot apply."""
    return {path: style for path, style in plan.items()
            if style.lower() not in STYLES and style.lower() not in INFERRED_STYLES}


def specs_from_hf_plan(plan: dict[str, str]) -> list[LayerSpec]:
    """The plan's entries as rules, in its order; TensorParallelError listing unsupported styles."""
    bad = unsupported_styles(plan)
    if bad:
        raise TensorParallelError(f"config.base_model_tp_plan uses style(s) dstp cannot apply: {bad}; supported: "
                                  f"{', '.join(sorted(STYLES))} (set tensor_parallel.preset_model or "
                                  f"partition_config instead)")
    specs = []
    for path, style in plan.items():
        if style.lower() in INFERRED_STYLES:
            continue
        kind, extra = STYLES[style.lower()]
        specs.append(LayerSpec(patterns=(hf_pattern(path),), partition_type=kind,
                               source=f"base_model_tp_plan[{path!r}] = {style!r}", **extra))
    return specs
