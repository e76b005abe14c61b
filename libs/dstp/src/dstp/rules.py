"""Which rules a model is split by, from the config: preset_model and partition_config first, then the
model's own `config.base_model_tp_plan`, then the preset of its model_type (as the reference orders them)."""

from __future__ import annotations

from typing import Any

from .errors import TensorParallelError
from .geometry import ModelGeometry
from .hf_plan import specs_from_hf_plan, unsupported_styles
from .presets import PRESETS, preset_specs
from .specs import LayerSpec, specs_from_config


def resolve_specs(preset_model: str | None, partition_config: Any, geometry: ModelGeometry
                  ) -> tuple[list[LayerSpec], str, list[str]]:
    """(ordered rules, where they came from, notes). `partition_config` is dsconfig's TPPartitionConfig
    (or None): its layer_specs come before the preset's when use_default_specs, else replace them."""
    notes: list[str] = []
    custom = specs_from_config(partition_config)
    if preset_model is not None or custom:
        base = preset_specs(preset_model, geometry) if preset_model is not None else []
        if custom and base and partition_config.use_default_specs:
            return custom + base, f"partition_config + preset {preset_model}", notes
        if custom:
            if base:
                notes.append("partition_config.use_default_specs is false: the preset's rules are not used")
            return custom, "partition_config", notes
        return base, f"preset {preset_model}", notes
    hf_plan = geometry.base_model_tp_plan
    model_type = (geometry.model_type or "").lower()
    if hf_plan:
        bad = unsupported_styles(hf_plan)
        if not bad:
            return specs_from_hf_plan(hf_plan), "the model's config.base_model_tp_plan", notes
        if model_type not in PRESETS:
            specs_from_hf_plan(hf_plan)  # raises, naming the styles
        notes.append(f"config.base_model_tp_plan uses {sorted(set(bad.values()))}, which dstp cannot apply; "
                     f"the {model_type} preset is used instead")
    if model_type in PRESETS:
        return preset_specs(model_type, geometry), f"preset {model_type} (the model's model_type)", notes
    raise TensorParallelError(f"tensor_parallel: no partition rules for this model (model_type {geometry.model_type!r}, "
                              f"no config.base_model_tp_plan): set tensor_parallel.preset_model (one of "
                              f"{', '.join(PRESETS)}) or tensor_parallel.partition_config.layer_specs")
