"""AutoEP: expert parallelism for Hugging Face MoE models from the `expert_parallel` config.

    from dsmoe import autoep
    autoep.apply(model, cfg.expert_parallel, ep_group)   # before the optimizer is built

Each MoE block (Mixtral, Qwen2/3-MoE, Qwen3.5-MoE, DeepSeek-V2/V3, or a custom one by patterns)
becomes a dropless AutoEPLayer: float32 routing as the model's (softmax/sigmoid, group-limited,
correction bias, renormalisation, scaling), tokens exchanged with an exact-split all-to-all-v, and
this rank's experts computed by torch._grouped_mm, a Triton grouped GEMM or a per-expert loop.
"""

from .apply import apply, autoep_layers, placed_modules
from .checkpoint import (
    full_expert_state_dict,
    global_expert_states,
    load_global_expert_states,
    stacked_expert_weights,
)
from .grouped import BACKENDS, choose_backend, expert_mlp, grouped_matmul
from .layer import AutoEPLayer, BlockNames, LocalExperts
from .presets import PRESETS, Preset
from .routing import RoutingSpec, route

__all__ = [
    "BACKENDS",
    "PRESETS",
    "AutoEPLayer",
    "BlockNames",
    "LocalExperts",
    "Preset",
    "RoutingSpec",
    "apply",
    "autoep_layers",
    "choose_backend",
    "expert_mlp",
    "full_expert_state_dict",
    "global_expert_states",
    "grouped_matmul",
    "load_global_expert_states",
    "placed_modules",
    "route",
    "stacked_expert_weights",
]
