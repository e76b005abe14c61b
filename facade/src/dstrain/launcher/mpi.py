"""The command lines of DeepSpeed's MPI and SLURM launchers: `--launcher openmpi|mpich|impi|mvapich|slurm`.

One `mpirun` (or `srun`) starts every rank of the job, laid out as DeepSpeed's runner lays it out
(deepspeed/launcher/multinode_runner.py), with `--launcher_args` where DeepSpeed puts them. Each rank
runs the rank wrapper (_rank.py) rather than the script directly: it reads its rank from the launcher's
variables (OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*, SLURM_*; dscomm.discovery) and exports them as
torch's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, arms its parent-death signal, binds its cores,
answers `import deepspeed` and passes `--local_rank=N`, as under torchrun.

Where DeepSpeed's line is wrong for the launcher it targets, the launcher's own documented form is used:
MPICH's and MVAPICH's Hydra `mpirun` take `-genv NAME VALUE` / `-env NAME VALUE` (two words; DeepSpeed
writes `NAME=VALUE`, which Hydra reads as a name and takes the next word as its value), and values reach
every launcher as argv words, never through a shell, so DeepSpeed's added quotes are not needed.

Pure functions over plain data, tested without processes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .commands import RANK_ENTRY, Job
from .errors import LaunchError

MPI_LAUNCHERS = ("openmpi", "mpich", "impi", "mvapich", "slurm")
TITLE = {"openmpi": "OpenMPI", "mpich": "MPICH", "impi": "Intel MPI", "mvapich": "MVAPICH", "slurm": "SLURM"}
PROGRAM = {"openmpi": "mpirun", "mpich": "mpirun", "impi": "mpirun", "mvapich": "mpirun", "slurm": "srun"}
# What tells this launcher is installed (DeepSpeed's checks: OpenMPI's mpirun is told from MPICH's by ompi_info).
PROBE = {"openmpi": "ompi_info", "mpich": "mpirun", "impi": "mpirun", "mvapich": "mpirun", "slurm": "srun"}
INSTALL = {"openmpi": "Debian/Ubuntu: apt-get install openmpi-bin", "mpich": "Debian/Ubuntu: apt-get install mpich",
           "impi": "Intel's oneAPI HPC toolkit (source its setvars.sh)",
           "mvapich": "MVAPICH2 from mvapich.cse.ohio-state.edu", "slurm": "run inside a SLURM allocation "
           "(salloc / sbatch) on a machine with SLURM's client commands"}
# Each launcher's separator between the programs of one MPMD (or SLURM heterogeneous) job: a script argument
# that is exactly this word would end the script's arguments and start a second program.
SEPARATOR = ":"
MVAPICH_DEFAULTS = {  # DeepSpeed's: no CMA (missing on Ubuntu), backtraces, the DL and allgather tuning, no pinning
    "MV2_SMP_USE_CMA": "0", "MV2_DEBUG_SHOW_BACKTRACE": "1", "MV2_SUPPORT_DL": "1", "MV2_ENABLE_AFFINITY": "0",
    "MV2_INTER_ALLGATHER_TUNING": "5", "MV2_CUDA_USE_NAIVE": "0"}


@dataclass(frozen=True)
class MpiJob:
    """A Job that one mpirun / srun starts, with what DeepSpeed's runners read from the command line."""

    flavour: str  # one of MPI_LAUNCHERS
    job: Job
    launcher_args: tuple[str, ...] = ()
    filtered: bool = False  # --include / --exclude chose the hosts (srun: --nodelist)
    num_nodes: int | None = None  # as given (srun: --nodes)
    num_gpus: int | None = None  # as given (srun: --gpus-per-node)
    master_addr_given: bool = False  # --master_addr (srun: else rank 0's node is SLURM's first of the step)
    cuda: bool = False  # GPUs here (MVAPICH: MV2_USE_CUDA=1, as DeepSpeed sets it for CUDA)

    @property
    def world_size(self) -> int:
        return sum(len(node.slots) for node in self.job.nodes)


def check(mj: MpiJob) -> None:
    """What this launcher cannot run as asked: a LaunchError naming it and what would work."""
    title = TITLE[mj.flavour]
    for i, arg in enumerate(mj.job.script_args):
        if arg == SEPARATOR:
            raise LaunchError(f"script argument {i + 1} is {SEPARATOR!r}, which {PROGRAM[mj.flavour]} reads as the "
                              f"start of a second program ({title} MPMD / heterogeneous jobs); pass it joined to its "
                              "option (--opt=:), or use --launcher ssh")
    counts = {node.host: len(node.slots) for node in mj.job.nodes}
    if mj.flavour != "openmpi" and len(set(counts.values())) > 1:
        raise LaunchError(f"--launcher {mj.flavour}: {title} runs the same number of processes on every host "
                          f"(-ppn), but the hosts chosen have {_listing(counts)}; choose the same number on each "
                          "(--num_gpus, --include), or use --launcher openmpi or ssh")
    slots = {node.host: list(node.slots) for node in mj.job.nodes}
    prefixes = all(s == list(range(len(s))) for s in slots.values())
    if mj.flavour == "slurm" and not prefixes:
        raise LaunchError(f"--launcher slurm: srun places tasks by count and cannot choose device ids, but the "
                          f"hosts chosen use slots {_listing(slots)}; choose whole hosts or the first N slots of "
                          "each (--num_gpus N), or use --launcher ssh")
    if mj.job.set_visible_devices and not prefixes and len({tuple(s) for s in slots.values()}) > 1:
        raise LaunchError(f"--launcher {mj.flavour}: one {PROGRAM[mj.flavour]} gives every rank the same "
                          f"environment, so every host must use the same device ids, but the hosts chosen use "
                          f"{_listing(slots)}; choose the same slots on each host, or use --launcher ssh")


def _listing(per_host: dict) -> str:
    return ", ".join(f"{host}: {value}" for host, value in per_host.items())


def rank_argv(job: Job) -> list[str]:
    """What each rank runs: the rank wrapper around the script (see the module's docstring)."""
    flags = ((["--no_local_rank"] if not job.local_rank_arg else []) + (["--module"] if job.module else [])
             + (["--bind_cores", job.bind_cores] if job.bind_cores is not None else []))
    return [job.python, "-u", RANK_ENTRY, *flags, job.script, *job.script_args]


def exports(mj: MpiJob) -> dict[str, str]:
    """The variables every rank gets: the launcher's defaults (DeepSpeed's), what the launcher exports for every
    launch (prefixed variables, .deepspeed_env), the rendezvous, and the devices where every host uses the same."""
    env: dict[str, str] = {}
    if mj.flavour == "openmpi":
        env["UCX_TLS"] = "tcp"  # DeepSpeed's default; a UCX_TLS of the user's replaces it below
    if mj.flavour == "mvapich":
        env.update(MVAPICH_DEFAULTS)
        if mj.cuda:
            env["MV2_USE_CUDA"] = "1"
    env.update(mj.job.extra_env)
    if mj.flavour != "slurm" or mj.master_addr_given:
        env["MASTER_ADDR"] = mj.job.master_addr
    env["MASTER_PORT"] = str(mj.job.master_port)
    slot_lists = {tuple(node.slots) for node in mj.job.nodes}
    if mj.job.set_visible_devices and mj.flavour != "slurm" and len(slot_lists) == 1:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, next(iter(slot_lists))))
    return env


def hostfile_text(mj: MpiJob) -> str | None:
    """The hostfile this launcher reads (the job's hosts after --include / --exclude / --num_*), or None."""
    if mj.flavour == "openmpi":
        return "".join(f"{node.host} slots={len(node.slots)}\n" for node in mj.job.nodes)
    if mj.flavour == "mvapich":
        return "".join(f"{node.host}\n" for node in mj.job.nodes)
    return None


def command(mj: MpiJob, hostfile: str | None = None) -> list[str]:
    """The one command that starts every rank; `hostfile`: where hostfile_text(mj) was written."""
    check(mj)
    job, n = mj.job, str(mj.world_size)
    per_host = str(len(job.nodes[0].slots))
    hosts = ",".join(node.host for node in job.nodes)
    env = exports(mj)
    ranks = rank_argv(job)
    own_binding = job.bind_cores is not None  # the rank wrapper binds: the launcher must not bind first
    if hostfile is None and hostfile_text(mj) is not None:
        raise ValueError(f"--launcher {mj.flavour} needs the path its hostfile was written to")
    if mj.flavour == "openmpi":
        tcp_interface = [] if _sets_mca(mj.launcher_args, "btl_tcp_if_include") else \
            ["--mca", "btl_tcp_if_include", "eth0"]  # DeepSpeed's default, unless the launcher arguments set it
        return ["mpirun", "-n", n, "-hostfile", str(hostfile), "--mca", "btl", "^openib", *tcp_interface,
                *(["--bind-to", "none"] if own_binding else []), *mj.launcher_args,
                *[word for k, v in env.items() for word in ("-x", f"{k}={v}")], *ranks]
    if mj.flavour in ("mpich", "impi"):
        rendezvous = {"WORLD_SIZE": n, "LOCAL_SIZE": per_host}
        if mj.flavour == "impi":
            rendezvous["I_MPI_PIN"] = "0"  # Intel MPI pins by default; DeepSpeed turns it off and binds itself
        count = ["-n", n] if mj.flavour == "mpich" else []
        return ["mpirun", *count, "-ppn", per_host, *mj.launcher_args,
                *[word for k, v in {**env, **rendezvous}.items() for word in ("-genv", k, v)],
                "-hosts", hosts, *(["-n", n] if mj.flavour == "impi" else []), *ranks]
    if mj.flavour == "mvapich":
        return ["mpirun", "-np", n, "-ppn", per_host, "--hostfile", str(hostfile), *mj.launcher_args,
                *[word for k, v in env.items() for word in ("-env", k, v)], *ranks]
    if mj.flavour == "slurm":
        return ["srun", "-n", n, *mj.launcher_args, *slurm_placement(mj),
                *(["--cpu-bind=none"] if own_binding else []), slurm_export(env), *ranks]
    raise LaunchError(f"unknown launcher {mj.flavour!r}; the MPI and SLURM launchers are {', '.join(MPI_LAUNCHERS)}")


def slurm_placement(mj: MpiJob) -> list[str]:
    """srun's node choice, as DeepSpeed's: the filtered hosts by name, --num_nodes and --num_gpus as given."""
    placement: list[str] = []
    if mj.filtered:
        # --nodelist is an upper bound: without --nodes srun may run every task on a subset of it.
        placement += ["--nodelist", ",".join(node.host for node in mj.job.nodes), "--nodes", str(len(mj.job.nodes))]
    if mj.num_nodes is not None:
        placement += ["--nodes", str(mj.num_nodes)]
    if mj.num_gpus is not None:
        placement += ["--gpus-per-node", str(mj.num_gpus)]  # --num_gpus is per node; --gpus would be the total
    return placement


def slurm_export(env: dict[str, str]) -> str:
    """srun's --export=ALL,NAME=VALUE,...: srun splits it at commas, so a value holding one cannot be passed."""
    for key, value in env.items():
        if "," in value:
            raise LaunchError(f"variable {key}={value!r} holds a comma, which srun's --export reads as the start "
                              "of the next variable; export it in the allocation's environment instead (srun "
                              "passes every variable with --export=ALL), or use another launcher")
    return ",".join(["--export=ALL", *(f"{k}={v}" for k, v in env.items())])


def _sets_mca(args: tuple[str, ...], name: str) -> bool:
    return any(a in ("-mca", "--mca") and b == name for a, b in itertools.pairwise(args))
