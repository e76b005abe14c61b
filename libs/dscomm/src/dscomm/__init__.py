"""dscomm: torch.distributed with a parallel layout and its groups, portable collectives and comms logging.

    import dscomm
    dscomm.init_distributed()                 # torchrun's environment, or a world of one
    dscomm.all_reduce(tensor)                 # torch.distributed's signature, plus log_name / prof
    dscomm.configure(enabled=True); ...; dscomm.log_summary()
    groups = dscomm.ParallelDims(dscomm.get_world_size(), pipe=2).build()   # collective
    dscomm.all_reduce(tensor, group=groups.data)
"""

from . import checkpointing, groups, watchdog
from . import exit_settle as exit_settle  # registers its exit function (see its docstring)
from ._version import __version__
from .backend import (
    destroy,
    get_backend,
    get_local_rank,
    get_rank,
    get_timeout,
    get_world_size,
    init_distributed,
    is_initialized,
)
from .collectives import (
    CommHandle,
    P2POp,
    ReduceOp,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    describe_group,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter_tensor,
    send,
)
from .config_api import comms_logger_settings, configure, reset_comms_log
from .dims import GROUP_NAMES, ParallelCoord, ParallelDims
from .errors import CommError
from .parallel_groups import ParallelGroups
from .partitioned import PartitionedTensor
from .summary import get_comms_log, log_summary
from .tags import (
    EXPERT_PARAM_GROUP_TAG,
    PIPELINE_TIED_ATTR,
    TENSOR_PARALLEL_ATTR,
    expert_group_name,
    is_expert_param_group,
    is_tensor_parallel,
    pipeline_tied_copies,
)
from .topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = [
    "EXPERT_PARAM_GROUP_TAG",
    "GROUP_NAMES",
    "PIPELINE_TIED_ATTR",
    "TENSOR_PARALLEL_ATTR",
    "CommError",
    "CommHandle",
    "P2POp",
    "ParallelCoord",
    "ParallelDims",
    "ParallelGroups",
    "PartitionedTensor",
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "ProcessTopology",
    "ReduceOp",
    "__version__",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "checkpointing",
    "comms_logger_settings",
    "configure",
    "describe_group",
    "destroy",
    "expert_group_name",
    "get_backend",
    "get_comms_log",
    "get_local_rank",
    "get_rank",
    "get_timeout",
    "get_world_size",
    "groups",
    "init_distributed",
    "irecv",
    "is_expert_param_group",
    "is_initialized",
    "is_tensor_parallel",
    "isend",
    "log_summary",
    "pipeline_tied_copies",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "reset_comms_log",
    "send",
    "watchdog",
]
