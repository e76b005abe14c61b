"""Fast CPU optimizer ops: the step ZeRO's CPU optimizer offload runs.

    opt = dszero.ops.CPUAdam(model.parameters(), lr=1e-3, weight_decay=0.01)  # AdamW by default
"""

from .cpu_adam import CPUAdam, cpu_adam_step, native_available

# DeepSpeed's name (deepspeed.ops.adam.DeepSpeedCPUAdam), so migrating is an import change.
DeepSpeedCPUAdam = CPUAdam

__all__ = ["CPUAdam", "DeepSpeedCPUAdam", "cpu_adam_step", "native_available"]
