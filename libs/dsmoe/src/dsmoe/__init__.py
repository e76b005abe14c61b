"""dsmoe: Mixture of Experts with DeepSpeed's MoE layer API.

    from dsmoe import MoE
    layer = MoE(hidden_size=512, expert=mlp, num_experts=8, ep_size=2, k=1, capacity_factor=1.25)
    layer.set_deepspeed_parallelism()          # expert groups from dscomm (dstrain.initialize does it)
    output, l_aux, exp_counts = layer(hidden_states)

Gating is pure functions (`top1gating`, `top2gating`, `topkgating`); tokens reach experts on other
ranks through a differentiable all-to-all. PR-MoE (`pyramid_layers`, use_residual) and
Mixture-of-Students (`MixtureOfStudents`) are here too. Modules mirror DeepSpeed's:
`dsmoe.layer`, `dsmoe.sharded_moe`, `dsmoe.experts`, `dsmoe.utils`.
"""

from . import checkpoint, layer, sharded_moe, utils
from ._version import __version__
from .all_to_all import all_to_all
from .capacity import expert_capacity
from .checkpoint import expert_file_name, load_local_experts, local_expert_states
from .dispatch import choose_dispatch, dense_moe, sparse_moe
from .distillation import MixtureOfStudents, distillation_loss
from .errors import MoEError
from .experts import Experts
from .gating import Routing, route_top1, route_top2, route_topk, top1gating, top2gating, topkgating
from .layer import MoE, check_expert_parallel_size
from .noise import gumbel_rsample, multiplicative_jitter
from .pyramid import DenseMLP, expand_num_experts, pyramid_layers
from .sharded_moe import MOELayer, TopKGate
from .utils import (
    configure_moe_param_groups,
    has_moe_layers,
    is_moe_param,
    is_moe_param_group,
    moe_aux_loss,
    moe_layers,
    split_params_grads_into_shared_and_expert_params,
    split_params_into_different_moe_groups_for_optimizer,
    split_params_into_shared_and_expert_params,
)

__all__ = [
    "DenseMLP",
    "Experts",
    "MOELayer",
    "MixtureOfStudents",
    "MoE",
    "MoEError",
    "Routing",
    "TopKGate",
    "__version__",
    "all_to_all",
    "check_expert_parallel_size",
    "checkpoint",
    "choose_dispatch",
    "configure_moe_param_groups",
    "dense_moe",
    "distillation_loss",
    "expand_num_experts",
    "expert_capacity",
    "expert_file_name",
    "gumbel_rsample",
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "layer",
    "load_local_experts",
    "local_expert_states",
    "moe_aux_loss",
    "moe_layers",
    "multiplicative_jitter",
    "pyramid_layers",
    "route_top1",
    "route_top2",
    "route_topk",
    "sharded_moe",
    "sparse_moe",
    "split_params_grads_into_shared_and_expert_params",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
    "top1gating",
    "top2gating",
    "topkgating",
    "utils",
]
