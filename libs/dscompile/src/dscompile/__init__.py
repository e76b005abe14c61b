"""dscompile: DeepCompile for dstrain. torch.compile captures forward and backward; graph passes insert
ZeRO's all-gathers, releases and reductions as ops the graph holds, then schedule them (prefetch within a
memory budget, keep the costliest units gathered, free or offload activations, offload optimizer states),
all through dszero's own controls, so compiled and eager ZeRO share one partitioning and one checkpoint.

    runtime = dscompile.deepcompile(model, zero_optimizer, dsconfig.CompileConfig(deepcompile=True))
"""

from . import ops
from ._version import __version__
from .checkpointing import LongContextBackend, LongContextPartitioner, long_context_backend
from .compiler import deepcompile, uncompile
from .errors import DeepCompileError
from .graphinfo import Budgets, GraphInfo, ParamSlot, Profile, UnitSlot
from .memory import MemoryProfile, profile_memory
from .passes import REGISTRY as PASSES
from .runtime import DeepCompileRuntime
from .schedule import WARMUP, default_schedule, validate_schedule

__all__ = [
    "PASSES",
    "WARMUP",
    "Budgets",
    "DeepCompileError",
    "DeepCompileRuntime",
    "GraphInfo",
    "LongContextBackend",
    "LongContextPartitioner",
    "MemoryProfile",
    "ParamSlot",
    "Profile",
    "UnitSlot",
    "__version__",
    "deepcompile",
    "default_schedule",
    "long_context_backend",
    "ops",
    "profile_memory",
    "uncompile",
    "validate_schedule",
]
