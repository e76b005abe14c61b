"""dstp: AutoTP tensor parallelism for Hugging Face models from a DeepSpeed config's `tensor_parallel`
section, and Domino's communication hiding (tp_overlap_comm).

    plan = dstp.plan_for(model, 2, preset_model="llama")      # pure: every parameter and its split
    print(plan.format())
    tp = dstp.parallelize(model, groups.tensor, plan)          # cut in place, layers swapped
"""

from . import ops  # registers torch.ops.dstp.* (the autotp pass's graph operators)
from ._version import __version__
from .apply import TensorParallelModel, parallelize, param_infos, plan_for, state_of
from .autotp_pass import AutoTPRuntime, compile_autotp, insert_tp_collectives, uncompile_autotp
from .comm import CommClock, TensorGroup
from .compiled import defer_collectives_to_compiler, restore_collectives
from .errors import TensorParallelError
from .geometry import ModelGeometry
from .hf_plan import hf_tp_plan, specs_from_hf_plan
from .layers import ColumnParallelLinear, RowParallelLinear
from .overlap import HalfBatchOverlap
from .plan import ParamInfo, ParamPlan, TensorParallelPlan, build_plan
from .presets import PRESETS, preset_specs
from .rules import resolve_specs
from .shard import merge_shards, shard_tensor
from .specs import LayerSpec, specs_from_config
from .vocab import VocabParallelCausalLMLoss, vocab_parallel_cross_entropy

__all__ = [
    "PRESETS",
    "AutoTPRuntime",
    "ColumnParallelLinear",
    "CommClock",
    "HalfBatchOverlap",
    "LayerSpec",
    "ModelGeometry",
    "ParamInfo",
    "ParamPlan",
    "RowParallelLinear",
    "TensorGroup",
    "TensorParallelError",
    "TensorParallelModel",
    "TensorParallelPlan",
    "VocabParallelCausalLMLoss",
    "__version__",
    "build_plan",
    "compile_autotp",
    "defer_collectives_to_compiler",
    "hf_tp_plan",
    "insert_tp_collectives",
    "merge_shards",
    "ops",
    "parallelize",
    "param_infos",
    "plan_for",
    "preset_specs",
    "resolve_specs",
    "restore_collectives",
    "shard_tensor",
    "specs_from_config",
    "specs_from_hf_plan",
    "state_of",
    "uncompile_autotp",
    "vocab_parallel_cross_entropy",
]
