"""The `dstrain` launcher (DeepSpeed's `deepspeed` command): hostfiles, filters, per-node torchrun, or one
mpirun / srun for the job (`--launcher openmpi|mpich|impi|mvapich|slurm`)."""

from ._proctree import dies_with_parent
from .errors import FilterError, HostfileError, LaunchError
from .hostfile import filter_resources, parse_hostfile, parse_hostfile_text, select_resources

__all__ = ["FilterError", "HostfileError", "LaunchError", "dies_with_parent", "filter_resources", "parse_hostfile",
           "parse_hostfile_text", "select_resources"]
