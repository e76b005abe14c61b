"""DeepSpeed's optimizer wrapper classes as kinds of dstrain's one ZeRO optimizer.

DeepSpeed wraps the basic optimizer in a different class per configuration: `DeepSpeedZeroOptimizer` at ZeRO
stages 1-2, `DeepSpeedZeroOptimizer_Stage3` at stage 3, `FP16_Optimizer` / `BF16_Optimizer` at stage 0 with fp16
/ bf16. Scripts (and DeepSpeed's tests) ask `isinstance(engine.optimizer, DeepSpeedZeroOptimizer)` to know which
they have. dstrain has one, `dszero.ZeroOptimizer`, at every stage: each of DeepSpeed's names here is a class
that `isinstance` answers for from the optimizer's stage and precision, so those checks hold as in DeepSpeed.
They cannot be built (`engine.optimizer` is the optimizer); the state they expose under DeepSpeed's names
(`single_partition_of_fp32_groups`, `fp32_partitioned_groups_flat`, `fp32_groups_flat`) is dszero's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _KindMeta(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        import dszero

        return isinstance(instance, dszero.ZeroOptimizer) and cls._matches(instance)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return type.__subclasscheck__(cls, subclass)


class _OptimizerKind(metaclass=_KindMeta):
    _matches: Callable[[Any], bool] = staticmethod(lambda optimizer: False)
    _built_by = ""

    def __new__(cls, *args, **kwargs):
        raise TypeError(f"{cls.__name__} is a kind of dstrain's ZeRO optimizer (isinstance answers for "
                        f"engine.optimizer), not a class to build: {cls._built_by}")


class DeepSpeedZeroOptimizer(_OptimizerKind):
    """ZeRO stages 1 and 2."""

    _matches = staticmethod(lambda optimizer: optimizer.stage in (1, 2))
    _built_by = "deepspeed.initialize() with zero_optimization.stage 1 or 2 builds it"


class DeepSpeedZeroOptimizer_Stage3(_OptimizerKind):
    """ZeRO stage 3."""

    _matches = staticmethod(lambda optimizer: optimizer.stage == 3)
    _built_by = "deepspeed.initialize() with zero_optimization.stage 3 builds it"


class FP16_Optimizer(_OptimizerKind):
    """Stage 0 with fp16 (DeepSpeed's fused fp16 optimizer)."""

    _matches = staticmethod(lambda optimizer: optimizer.stage == 0 and optimizer.precision.dtype == "fp16")
    _built_by = "deepspeed.initialize() with fp16 enabled and ZeRO off builds it"


class FP16_UnfusedOptimizer(_OptimizerKind):
    """DeepSpeed's per-tensor fp16 optimizer (for Lamb): dstrain's fp16 at stage 0 is always the flat one, so no
    optimizer is of this kind."""

    _built_by = "dstrain's fp16 optimizer at stage 0 is FP16_Optimizer's kind"


class BF16_Optimizer(_OptimizerKind):
    """Stage 0 with bf16."""

    _matches = staticmethod(lambda optimizer: optimizer.stage == 0 and optimizer.precision.dtype == "bf16")
    _built_by = "deepspeed.initialize() with bf16 enabled and ZeRO off builds it"
