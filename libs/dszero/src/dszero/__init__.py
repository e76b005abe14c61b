"""dszero: ZeRO for any torch module and optimizer: partitioned optimizer state (stage 1), gradients
(stage 2) and parameters (stage 3, `Init`), CPU/NVMe offload, mixed precision with loss scaling, and
checkpoints that load at any world size.

    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), dsconfig.ZeroConfig(stage=2))
"""

from ._version import __version__
from .checkpoint import convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint
from .errors import CheckpointError, ZeroConfigError, ZeroError
from .estimators import (
    estimate_zero2_model_states_mem_needs_all_cold,
    estimate_zero2_model_states_mem_needs_all_live,
    estimate_zero3_model_states_mem_needs_all_cold,
    estimate_zero3_model_states_mem_needs_all_live,
)
from .fragments import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_set_full_fp32_param,
)
from .held import HeldParameters
from .inference import ZeroInference
from .init import Init
from .layout import GroupLayout, Slot
from .offload.resources import check_offload_resources
from .optimizer import ZeroOptimizer
from .precision import DynamicLossScaler, LossScaler, Precision
from .quantize import QuantSpec
from .stage3 import GatheredParameters
from .status import ZeroParamStatus
from .whole_tensors import TensorShards, WholeTensor
from .zeropp import ZeroPPSettings

__all__ = [
    "CheckpointError",
    "DynamicLossScaler",
    "GatheredParameters",
    "GroupLayout",
    "HeldParameters",
    "Init",
    "LossScaler",
    "Precision",
    "QuantSpec",
    "Slot",
    "TensorShards",
    "WholeTensor",
    "ZeroConfigError",
    "ZeroError",
    "ZeroInference",
    "ZeroOptimizer",
    "ZeroPPSettings",
    "ZeroParamStatus",
    "__version__",
    "check_offload_resources",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "estimate_zero2_model_states_mem_needs_all_cold",
    "estimate_zero2_model_states_mem_needs_all_live",
    "estimate_zero3_model_states_mem_needs_all_cold",
    "estimate_zero3_model_states_mem_needs_all_live",
    "get_fp32_state_dict_from_zero_checkpoint",
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "safe_get_full_optimizer_state",
    "safe_set_full_fp32_param",
]
