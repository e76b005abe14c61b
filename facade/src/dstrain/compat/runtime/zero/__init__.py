"""`deepspeed.runtime.zero`: ZeRO's public names, from dszero. `partition_parameters` (dszero's module of
that name: Init, GatheredParameters, ZeroParamStatus, the tensor-constructor overrides) and `offload_config`
are attributes too, as in DeepSpeed; `unwrap_model_for_generation` is stage3's."""

from dszero import GatheredParameters, Init, ZeroParamStatus

from ...lazy import submodule_attributes
from .stage3 import unwrap_model_for_generation

__getattr__ = submodule_attributes(__name__, {"partition_parameters": "dszero.partition_parameters",
                                              "offload_config": ".offload_config", "config": ".config",
                                              "leaf_module_config": ".leaf_module_config",
                                              "stage_1_and_2": ".stage_1_and_2", "stage3": ".stage3",
                                              "utils": ".utils"},
                                 "deepspeed.runtime.zero")

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus", "unwrap_model_for_generation"]
