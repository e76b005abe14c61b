"""Which process of which job this is, read from what its launcher put in the environment.

torchrun sets torch.distributed's own variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). MPI launchers and SLURM's srun set their own; `discover` turns those into torch's,
as DeepSpeed's `init_distributed(auto_mpi_discovery=True)` does:

| launcher | rank | world size | local rank | processes on this machine |
|---|---|---|---|---|
| OpenMPI `mpirun` | OMPI_COMM_WORLD_RANK | OMPI_COMM_WORLD_SIZE | OMPI_COMM_WORLD_LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_SIZE |
| MVAPICH `mpirun` | MV2_COMM_WORLD_RANK | MV2_COMM_WORLD_SIZE | MV2_COMM_WORLD_LOCAL_RANK | MV2_COMM_WORLD_LOCAL_SIZE |
| MPICH / Intel MPI (PMI) | PMI_RANK, PMIX_RANK | PMI_SIZE | MPI_LOCALRANKID, PALS_LOCAL_RANKID | MPI_LOCALNRANKS, PALS_LOCAL_SIZE |
| SLURM `srun` | SLURM_PROCID | SLURM_STEP_NUM_TASKS | SLURM_LOCALID | SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID |

DeepSpeed asks mpi4py for the rank, the world size, the local rank and rank 0's address; these
variables hold the first three without it, and the address comes from MASTER_ADDR where the launcher
set it (the `dstrain` launcher always does), else 127.0.0.1 when every rank is on one machine, else
the first node of the SLURM step. Only an MPI job across machines started without MASTER_ADDR
outside SLURM has no answer: the error says to pass it (`mpirun -x MASTER_ADDR=<rank 0's host>`).

SLURM is read from the step's variables only (SLURM_STEP_NUM_TASKS): a batch script also has
SLURM_PROCID and SLURM_NTASKS, but a plain `python train.py` in it is one process, not rank 0 of
SLURM_NTASKS. MPI variables win over SLURM's: an `mpirun` inside an allocation starts its daemons as
a SLURM step, so the ranks inherit a step that describes the daemons.

Pure: a mapping in, a LaunchEnvironment out; no torch, no processes, nothing imported from dscomm
(the `dstrain` launcher's rank wrapper loads this file by path, before torch). Bad values raise
ValueError naming the variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_PORT = 29500  # DeepSpeed's and torch's


@dataclass(frozen=True)
class Flavour:
    name: str
    rank: tuple[str, ...]  # every one set must agree
    size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]


FLAVOURS = (
    Flavour("OpenMPI", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_LOCAL_RANK",),
            ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    Flavour("MVAPICH", ("MV2_COMM_WORLD_RANK",), ("MV2_COMM_WORLD_SIZE",), ("MV2_COMM_WORLD_LOCAL_RANK",),
            ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    Flavour("MPICH / Intel MPI (PMI)", ("PMI_RANK", "PMIX_RANK"), ("PMI_SIZE",),
            ("MPI_LOCALRANKID", "PALS_LOCAL_RANKID"), ("MPI_LOCALNRANKS", "PALS_LOCAL_SIZE")),
    Flavour("SLURM", ("SLURM_PROCID",), ("SLURM_STEP_NUM_TASKS",), ("SLURM_LOCALID",), ()),
)


@dataclass(frozen=True)
class LaunchEnvironment:
    """One process's place in its job, in torch.distributed's terms."""

    source: str  # "torchrun" or a Flavour's name
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None  # None where the launcher does not say
    master_addr: str
    master_port: int

    def torch_environment(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous (and torchrun's scripts) read."""
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
               "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return env


def has_torch_environment(environ: Mapping[str, str]) -> bool:
    """Whether torch's five variables are all set (torchrun's launch): nothing to discover, as in DeepSpeed."""
    return all(name in environ for name in TORCH_VARIABLES)


def detect_flavour(environ: Mapping[str, str]) -> Flavour | None:
    for flavour in FLAVOURS:
        if any(name in environ for name in flavour.rank) and any(name in environ for name in flavour.size):
            return flavour
    return None


def discover(environ: Mapping[str, str], distributed_port: int = DEFAULT_PORT) -> LaunchEnvironment | None:
    """This process's place from `environ`: torchrun's variables when all five are set, else those of
    the MPI or SLURM launcher that started it; None when no launcher did (a world of one)."""
    if has_torch_environment(environ):
        return LaunchEnvironment("torchrun", _int(environ, "RANK"), _int(environ, "WORLD_SIZE"),
                                 _int(environ, "LOCAL_RANK"), _optional_int(environ, "LOCAL_WORLD_SIZE"),
                                 environ["MASTER_ADDR"], _int(environ, "MASTER_PORT"))
    flavour = detect_flavour(environ)
    if flavour is None:
        return None
    rank = _agreed(environ, flavour.rank, flavour.name)
    world_size = _agreed(environ, flavour.size, flavour.name)
    if not 0 <= rank < world_size:
        raise ValueError(f"{flavour.name}: rank {rank} is outside 0..{world_size - 1} (world size {world_size}, "
                         f"from {_names(environ, flavour.rank + flavour.size)})")
    # srun starting MPI ranks itself (`srun --mpi=pmi2`) sets PMI_RANK but not always a local rank: its
    # own step, when it describes these same ranks, has one.
    step = FLAVOURS[-1] if flavour is not FLAVOURS[-1] and _same_ranks(environ, rank, world_size) else None
    if any(name in environ for name in flavour.local_rank):
        local_rank = _agreed(environ, flavour.local_rank, flavour.name)
    elif step is not None and "SLURM_LOCALID" in environ:
        local_rank = _int(environ, "SLURM_LOCALID")
    elif world_size == 1:
        local_rank = 0
    else:
        raise ValueError(f"{flavour.name}: rank {rank} of {world_size} has no local rank; expected one of "
                         f"{', '.join(flavour.local_rank)} in the environment")
    local_size = _local_size(environ, flavour)
    if local_size is None and step is not None:
        local_size = _local_size(environ, step)
    if local_size is not None and not 0 <= local_rank < local_size:
        raise ValueError(f"{flavour.name}: local rank {local_rank} is outside 0..{local_size - 1} "
                         f"({local_size} process(es) on this machine)")
    for name, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", local_rank)):
        if name in environ and environ[name].strip() != str(value):
            raise ValueError(f"{name}={environ[name]!r} is set, but {flavour.name} says {value} "
                             f"({_names(environ, _source_of(flavour, name))}); unset {name} or launch the "
                             "job one way only")
    port = _int(environ, "MASTER_PORT") if "MASTER_PORT" in environ else distributed_port
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT {port} is not a TCP port (1..65535)")
    addr = _master_addr(environ, flavour, rank, world_size, local_size)
    return LaunchEnvironment(flavour.name, rank, world_size, local_rank, local_size, addr, port)


def _master_addr(environ: Mapping[str, str], flavour: Flavour, rank: int, world_size: int,
                 local_size: int | None) -> str:
    if environ.get("MASTER_ADDR", "").strip():
        return environ["MASTER_ADDR"].strip()
    if world_size == 1 or local_size == world_size or (
            flavour.name == "SLURM" and environ.get("SLURM_STEP_NUM_NODES", "").strip() == "1"):
        return "127.0.0.1"
    if "SLURM_STEP_ID" in environ and (environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST")):
        return first_host(environ.get("SLURM_STEP_NODELIST") or environ["SLURM_NODELIST"])
    raise ValueError(f"{flavour.name}: rank {rank} of {world_size} runs across machines, and MASTER_ADDR (the "
                     "address of rank 0's machine) is not set; pass it to every rank (OpenMPI: `mpirun -x "
                     "MASTER_ADDR=<host>`, MPICH / Intel MPI: `-genv MASTER_ADDR <host>`), or start the job with "
                     "`dstrain --launcher ...`, which sets it (DeepSpeed asks mpi4py instead)")


def _local_size(environ: Mapping[str, str], flavour: Flavour) -> int | None:
    if any(name in environ for name in flavour.local_size):
        return _agreed(environ, flavour.local_size, flavour.name)
    if flavour.name == "SLURM" and "SLURM_STEP_TASKS_PER_NODE" in environ and "SLURM_NODEID" in environ:
        counts = tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
        node = _int(environ, "SLURM_NODEID")
        if not 0 <= node < len(counts):
            raise ValueError(f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE="
                             f"{environ['SLURM_STEP_TASKS_PER_NODE']!r} describes {len(counts)} node(s)")
        return counts[node]
    return None


def _same_ranks(environ: Mapping[str, str], rank: int, world_size: int) -> bool:
    """Whether a SLURM step in `environ` is these ranks (srun started them), not daemons of an mpirun."""
    try:
        return (_int(environ, "SLURM_STEP_NUM_TASKS") == world_size and _int(environ, "SLURM_PROCID") == rank)
    except (KeyError, ValueError):
        return False


def _source_of(flavour: Flavour, torch_name: str) -> tuple[str, ...]:
    return {"RANK": flavour.rank, "WORLD_SIZE": flavour.size, "LOCAL_RANK": flavour.local_rank}[torch_name]


def _agreed(environ: Mapping[str, str], names: tuple[str, ...], flavour: str) -> int:
    """The one value the set variables among `names` hold; an error when two disagree."""
    values = {name: _int(environ, name) for name in names if name in environ}
    if len(set(values.values())) > 1:
        raise ValueError(f"{flavour}: {_names(environ, names)} disagree; they name one process and must be equal")
    return next(iter(values.values()))


def _names(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    return ", ".join(f"{name}={environ[name]!r}" for name in names if name in environ)


def _int(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    if number < 0:
        raise ValueError(f"environment variable {name}={value!r} is negative")
    return number


def _optional_int(environ: Mapping[str, str], name: str) -> int | None:
    return _int(environ, name) if name in environ else None


_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed task counts, '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={text!r}: {item!r} is not N or N(xM)")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: 'gpu-[07,01-03],cpu1' -> 'gpu-07' (zero padding kept)."""
    text = nodelist.strip()
    depth, end = 0, len(text)
    for i, char in enumerate(text):  # the first entry ends at the first comma outside brackets
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            end = i
            break
    entry = text[:end]
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m[1], maxsplit=1)[0], entry)
    if not host or not re.fullmatch(r"[A-Za-z0-9_.-]+", host):
        raise ValueError(f"SLURM node list {nodelist!r}: cannot read a host name from {entry!r}")
    return host
