"""Fast CPU optimizer ops: the step ZeRO's CPU optimizer offload runs.

    opt = dszero.ops.CPUAdam(model.parameters(), lr=1e-3, weight_decay=0.01)  # AdamW by default
"""

from .cpu_adagrad_lion import CPUAdagrad, CPULion, DeepSpeedCPUAdagrad, DeepSpeedCPULion, FusedLion
from .cpu_adam import CPUAdam, cpu_adam_step, native_available
from .fused_adam import FusedAdam


class DeepSpeedCPUAdam(CPUAdam):
    """CPUAdam under DeepSpeed's name and positional order (deepspeed.ops.adam.DeepSpeedCPUAdam)."""

    def __init__(self, model_params, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, adamw_mode: bool = True, fp32_optimizer_states: bool = True):
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         adamw_mode=adamw_mode, bias_correction=bias_correction,
                         fp32_optimizer_states=fp32_optimizer_states)

__all__ = ["CPUAdagrad", "CPUAdam", "CPULion", "DeepSpeedCPUAdagrad", "DeepSpeedCPUAdam", "DeepSpeedCPULion", "FusedAdam",
           "FusedLion", "cpu_adam_step", "native_available"]
