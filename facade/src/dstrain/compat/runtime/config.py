"""`deepspeed.runtime.config`: DeepSpeed's `DeepSpeedConfig(config, mpu=None)`, built from a path, a dict or base64
JSON as DeepSpeed builds it: the batch triple resolved at the data-parallel size (the process group's world size
over the model-parallel size when one is initialized, else 1), unknown keys warned about (DeepSpeed ignores them).
It reads through dsconfig (`.config` is the loaded dsconfig DeepSpeedConfig, whose fields are also its
attributes) and adds DeepSpeed's derived names (`monitor_config`, `zero_config`, `zero_optimization_stage`,
`fp16_enabled`, `_param_dict`, ...). `dstrain.initialize(config=...)` takes it as it takes a dict."""

from __future__ import annotations

import warnings
from typing import Any

import dsconfig
from dsconfig import ConfigError as DeepSpeedConfigError

# DeepSpeed's lower-case names of the config's optimizer types (`optimizer.type`, matched case-insensitively).
ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
ONEBIT_ADAM_OPTIMIZER = "onebitadam"
ZERO_ONE_ADAM_OPTIMIZER = "zerooneadam"
ONEBIT_LAMB_OPTIMIZER = "onebitlamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = [ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, ONEBIT_ADAM_OPTIMIZER,
                        ONEBIT_LAMB_OPTIMIZER, ZERO_ONE_ADAM_OPTIMIZER, MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER,
                        MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER]
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"
ADAM_W_MODE_DEFAULT = True


def get_gradient_clipping(param_dict: dict) -> float:
    """The config dict's `gradient_clipping` (0.0: none; absent: the reference's default, 1.0), checked as dsconfig
    checks it."""
    given = {"gradient_clipping": param_dict["gradient_clipping"]} if "gradient_clipping" in param_dict else {}
    return float(dsconfig.load(given).gradient_clipping)


def get_log_level(param_dict: dict) -> str | None:
    """The config dict's `log_level` as written (None: unset), checked as dsconfig checks it."""
    return dsconfig.load({"log_level": param_dict.get("log_level")}).log_level


def _data_parallel_size(mpu: Any) -> int:
    import dscomm

    if mpu is not None and hasattr(mpu, "get_data_parallel_world_size"):
        return int(mpu.get_data_parallel_world_size())
    return dscomm.get_world_size() if dscomm.is_initialized() else 1


class BatchConfigError(DeepSpeedConfigError, AssertionError):
    """A batch triple that does not hold or is not determined. An AssertionError too: DeepSpeed asserts there."""


class DeepSpeedConfig:
    """A whole DeepSpeed config, loaded and checked by dsconfig, with DeepSpeed's attribute names."""

    def __init__(self, config: Any, mpu: Any = None, mesh_device: Any = None):
        raw, _ = dsconfig.read_source(config)
        self._param_dict = raw
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dsconfig.ConfigWarning)  # DeepSpeed's own spellings, read quietly
            self.config = dsconfig.load(raw, world_size=_data_parallel_size(mpu), strict=False)
        self.world_size = self.config.data_parallel_size

    def _configure_train_batch_size(self) -> None:
        """DeepSpeed's step that settles the batch triple from what is set (a script may set train_batch_size,
        train_micro_batch_size_per_gpu and gradient_accumulation_steps on the object, None for unset): the missing
        ones are derived at the data-parallel size (`world_size`), as dsconfig derives them; a triple that does not
        hold, or that two unset values leave open, is a BatchConfigError (an AssertionError too, as DeepSpeed's)."""
        from dsconfig.batch import GAS, MB, TB, resolve_batch_triple

        known = {key: getattr(self, key) for key in (TB, MB, GAS)}
        try:
            triple = resolve_batch_triple({k: v for k, v in known.items() if v is not None}, explicit_auto=(),
                                          data_parallel_size=self.world_size, require=True)
        except DeepSpeedConfigError as exc:
            raise BatchConfigError(exc.problems, source=exc.source) from None
        for key, value in triple.items():
            setattr(self, key, value)

    def __getattr__(self, name: str) -> Any:
        config = self.__dict__.get("config")
        if config is not None and not name.startswith("__"):
            try:
                return getattr(config, name)
            except AttributeError:
                pass
        raise AttributeError(f"DeepSpeedConfig has no attribute {name!r} (dstrain's config fields are dsconfig's "
                             f"DeepSpeedConfig's, plus DeepSpeed's derived names)")

    @property
    def monitor_config(self) -> Any:
        from ..monitor.config import DeepSpeedMonitorConfig

        return DeepSpeedMonitorConfig.of(self.config)

    @property
    def zero_config(self) -> Any:
        from .zero.config import DeepSpeedZeroConfig

        made = DeepSpeedZeroConfig.__new__(DeepSpeedZeroConfig)
        object.__setattr__(made, "config", self.config.zero_optimization)
        return made

    @property
    def zero_optimization_stage(self) -> int:
        return int(self.config.zero_optimization.stage)

    @property
    def elasticity_enabled(self) -> bool:
        return bool(self.config.elasticity.enabled)

    @property
    def elastic_model_parallel_size(self) -> int:
        return int(self.config.elasticity.model_parallel_size)

    @property
    def num_gpus_per_node(self) -> int:
        return int(self.config.elasticity.num_gpus_per_node)

    @property
    def zero_enabled(self) -> bool:
        return self.zero_optimization_stage > 0

    @property
    def fp16_enabled(self) -> bool:
        return bool(self.config.fp16.enabled)

    @property
    def bfloat16_enabled(self) -> bool:
        return bool(self.config.bf16.enabled)

    @property
    def optimizer_name(self) -> str | None:
        return self.config.optimizer.type if self.config.optimizer is not None else None

    @property
    def optimizer_params(self) -> dict | None:
        return dict(self.config.optimizer.params) if self.config.optimizer is not None else None

    @property
    def scheduler_name(self) -> str | None:
        return self.config.scheduler.type if self.config.scheduler is not None else None

    @property
    def scheduler_params(self) -> dict | None:
        return dict(self.config.scheduler.params) if self.config.scheduler is not None else None

    def __repr__(self) -> str:
        return f"DeepSpeedConfig({self.config!r})"


__all__ = [
    "ADAGRAD_OPTIMIZER",
    "ADAMW_OPTIMIZER",
    "ADAM_OPTIMIZER",
    "ADAM_W_MODE",
    "ADAM_W_MODE_DEFAULT",
    "DEEPSPEED_OPTIMIZERS",
    "LAMB_OPTIMIZER",
    "LION_OPTIMIZER",
    "MUADAMW_OPTIMIZER",
    "MUADAM_OPTIMIZER",
    "MUON_OPTIMIZER",
    "MUSGD_OPTIMIZER",
    "ONEBIT_ADAM_OPTIMIZER",
    "ONEBIT_LAMB_OPTIMIZER",
    "TORCH_ADAM_PARAM",
    "ZERO_ONE_ADAM_OPTIMIZER",
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "get_gradient_clipping",
    "get_log_level",
]
