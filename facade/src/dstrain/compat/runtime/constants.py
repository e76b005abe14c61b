"""`deepspeed.runtime.constants`: the config key names and defaults scripts and DeepSpeed's tests import (the
optimizer names are runtime.config's)."""

from .config import (
    ADAGRAD_OPTIMIZER,
    ADAM_OPTIMIZER,
    ADAM_W_MODE,
    ADAM_W_MODE_DEFAULT,
    ADAMW_OPTIMIZER,
    DEEPSPEED_OPTIMIZERS,
    LAMB_OPTIMIZER,
    LION_OPTIMIZER,
    MUON_OPTIMIZER,
    TORCH_ADAM_PARAM,
)

LOG_LEVEL = "log_level"
LOG_LEVEL_DEFAULT = None
STEPS_PER_PRINT = "steps_per_print"
STEPS_PER_PRINT_DEFAULT = 10
GRADIENT_CLIPPING = "gradient_clipping"
GRADIENT_CLIPPING_DEFAULT = 1.0  # dsconfig's default, the config reference's (every run without the key clips at 1.0)

__all__ = ["ADAGRAD_OPTIMIZER", "ADAMW_OPTIMIZER", "ADAM_OPTIMIZER", "ADAM_W_MODE", "ADAM_W_MODE_DEFAULT",
           "DEEPSPEED_OPTIMIZERS", "GRADIENT_CLIPPING", "GRADIENT_CLIPPING_DEFAULT", "LAMB_OPTIMIZER", "LION_OPTIMIZER",
           "LOG_LEVEL", "LOG_LEVEL_DEFAULT", "MUON_OPTIMIZER", "STEPS_PER_PRINT", "STEPS_PER_PRINT_DEFAULT",
           "TORCH_ADAM_PARAM"]
