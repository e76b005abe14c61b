"""`deepspeed.moe`: Mixture of Experts (dsmoe) inside dstrain.

    from dstrain.moe.layer import MoE                          # deepspeed.moe.layer.MoE
    from dstrain.moe.utils import split_params_into_different_moe_groups_for_optimizer

initialize() gives the model's MoE layers their expert groups and ZeRO its expert parameter groups.
Beyond DeepSpeed's names: `moe_aux_loss(model)` (the layers' summed l_aux), `report_expert_counts`
(expert loads to the monitors), PR-MoE's `pyramid_layers`, and Mixture-of-Students
(`MixtureOfStudents`, `distillation_loss`, `load_teacher`).
"""

from ...wiring.optional_libs import require

try:  # dsmoe is an optional library: name its install, not a stack
    from dsmoe import (
        DenseMLP,
        MixtureOfStudents,
        MoE,
        distillation_loss,
        expand_num_experts,
        moe_aux_loss,
        pyramid_layers,
    )
except ModuleNotFoundError:
    require("dsmoe", "dstrain.moe (Mixture of Experts)")
    raise

from ...checkpoint.moe_teacher import load_teacher
from ...engine.expert_reporting import expert_count_event, report_expert_counts
from . import experts, layer, sharded_moe, utils

__all__ = ["DenseMLP", "MixtureOfStudents", "MoE", "distillation_loss", "expand_num_experts", "expert_count_event",
           "experts", "layer", "load_teacher", "moe_aux_loss", "pyramid_layers", "report_expert_counts",
           "sharded_moe", "utils"]
