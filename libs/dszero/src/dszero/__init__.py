"""dszero: ZeRO for any torch module and optimizer: partitioned optimizer state (stage 1), gradients
(stage 2) and parameters (stage 3, `Init`), CPU/NVMe offload, mixed precision with loss scaling, and
checkpoints that load at any world size.

    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), dsconfig.ZeroConfig(stage=2))
"""

from ._version import __version__
from .checkpoint import convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint
from .compiler_controls import CompilerControls
from .errors import CheckpointError, ZeroConfigError, ZeroError
from .estimators import (
    estimate_zero2_model_states_mem_needs_all_cold,
    estimate_zero2_model_states_mem_needs_all_live,
    estimate_zero3_model_states_mem_needs_all_cold,
    estimate_zero3_model_states_mem_needs_all_live,
)
from .external import register_external_parameter, unregister_external_parameter
from .fragments import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_grad,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_grad,
    safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized,
)
from .held import HeldParameters
from .inference import ZeroInference
from .init import Init
from .layout import GroupLayout, Slot
from .leaf_modules import get_z3_leaf_modules, set_z3_leaf_modules, unset_z3_leaf_modules
from .offload.resources import check_offload_resources
from .optimizer import ZeroOptimizer
from .precision import DynamicLossScaler, LossScaler, Precision
from .quantize import QuantSpec
from .status import ZeroParamStatus
from .units import GatheredParameters
from .whole_tensors import TensorShards, WholeTensor
from .zeropp import ZeroPPSettings

__all__ = [
    "CheckpointError", "CompilerControls", "DynamicLossScaler", "GatheredParameters", "GroupLayout", "HeldParameters",
    "Init", "LossScaler", "Precision", "QuantSpec", "Slot", "TensorShards", "WholeTensor", "ZeroConfigError",
    "ZeroError", "ZeroInference", "ZeroOptimizer", "ZeroPPSettings", "ZeroParamStatus", "__version__",
    "check_offload_resources", "convert_zero_checkpoint_to_fp32_state_dict",
    "estimate_zero2_model_states_mem_needs_all_cold", "estimate_zero2_model_states_mem_needs_all_live",
    "estimate_zero3_model_states_mem_needs_all_cold", "estimate_zero3_model_states_mem_needs_all_live",
    "get_fp32_state_dict_from_zero_checkpoint", "get_z3_leaf_modules", "register_external_parameter",
    "safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state", "safe_get_local_fp32_param",
    "safe_get_local_grad", "safe_get_local_optimizer_state", "safe_set_full_fp32_param", "safe_set_full_grad",
    "safe_set_full_optimizer_state", "safe_set_local_fp32_param", "safe_set_local_grad",
    "safe_set_local_optimizer_state", "safe_update_full_grad_vectorized", "set_z3_leaf_modules",
    "unregister_external_parameter", "unset_z3_leaf_modules",
]
