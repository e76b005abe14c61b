"""Runs one rank's training script the way DeepSpeed's launcher does, inside torchrun (or mpirun / srun).

    python _rank.py [--no_local_rank] [--module] [--bind_cores all|LIST] SCRIPT_OR_MODULE [ARGS...]

torchrun sets LOCAL_RANK, RANK and WORLD_SIZE; DeepSpeed scripts also expect `--local_rank=N` as
their first argument, which torchrun does not pass, so this wrapper inserts it (unless
`--no_local_rank`) and then runs the script as `__main__`, as `python SCRIPT ARGS` would. It is
run by path and imports nothing from dstrain but the small `dstrain.as_deepspeed` hook (where no real
DeepSpeed is installed and DSTRAIN_DEEPSPEED_ALIAS is not "0"), so an unchanged DeepSpeed script's
`import deepspeed` runs on dstrain.

Under mpirun or srun (`--launcher openmpi|mpich|impi|mvapich|slurm`) there is no torchrun: the rank
reads its place from the launcher's variables with dscomm's reader (dscomm/discovery.py, loaded by
path, before torch) and exports torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT first.

`--bind_cores` (the launcher's --bind_cores_to_rank / --bind_core_list) pins this rank to its share
of the node's cores, before torch starts any thread, and sets OMP_NUM_THREADS to the share's size:
through numactl where installed (which also binds memory to the share's NUMA node), else with
sched_setaffinity.

The rank arms a parent-death signal (SIGTERM when torchrun, or the MPI daemon that started it, dies,
however it dies), so a node whose torchrun was killed outright does not keep its ranks running.
"""

import importlib.util
import os
import runpy
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cores  # sibling files: this script runs by path
import _proctree

del sys.path[0]  # the script's own imports must not see the launcher's folder

ALIAS_ENV = "DSTRAIN_DEEPSPEED_ALIAS"  # "0" (the launcher's --no_deepspeed_alias): leave `import deepspeed` alone


def bind_to_share(spec: str, argv_after: list[str]) -> None:
    """Pin this rank to its share of the node's cores (`spec`: 'all' or a core list); returns only
    when pinned here (with numactl this process is replaced by `numactl ... python _rank.py argv_after`)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    nprocs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        cores = _cores.node_cores(None if spec == "all" else spec, nprocs, where=f"node {os.uname().nodename}")
    except ValueError as exc:
        print(f"dstrain rank {os.environ.get('RANK', local_rank)}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    mine = _cores.share(cores, local_rank, nprocs)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))  # one OpenMP thread per core of the share
    numactl = shutil.which("numactl")
    if numactl is not None:
        node = _cores.numa_node_of(mine)
        memory = [f"--membind={node}"] if node is not None else []
        # The same interpreter options (torchrun's -u) before this file, as it was started.
        options = sys.orig_argv[1 : sys.orig_argv.index(sys.argv[0])] if sys.argv[0] in sys.orig_argv else []
        python = [sys.executable, *options, os.path.abspath(__file__)]
        os.execv(numactl, [numactl, f"--physcpubind={_cores.format_core_list(mine)}", *memory, "--",
                           *python, *argv_after])
    os.sched_setaffinity(0, mine)


TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def adopt_launcher_environment() -> None:
    """Under mpirun or srun (`--launcher openmpi|mpich|impi|mvapich|slurm`) this rank's place is in their
    variables (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, ...): export it as torchrun's, which the core
    binding, --local_rank and the script read. Under torchrun there is nothing to do."""
    if all(name in os.environ for name in TORCH_VARIABLES):
        return
    # dscomm's reader, loaded by its path: importing the dscomm package would import torch before the binding.
    spec = importlib.util.find_spec("dscomm")
    if spec is None or not spec.submodule_search_locations:
        _fail("dscomm is not installed, and reads this rank's place from its MPI / SLURM launcher")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "discovery.py")
    loader_spec = importlib.util.spec_from_file_location("_dstrain_rank_discovery", path)
    discovery = importlib.util.module_from_spec(loader_spec)
    sys.modules[loader_spec.name] = discovery  # its dataclasses look their module up there
    loader_spec.loader.exec_module(discovery)
    try:
        found = discovery.discover(os.environ)
    except ValueError as exc:
        _fail(f"cannot read this rank's place from its launcher: {exc}")
    if found is not None:
        os.environ.update(found.torch_environment())


def _fail(message: str) -> None:
    print(f"dstrain rank: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main() -> None:
    # torchrun (or mpirun's / srun's daemon) killed outright (its keeper and agent too) must not leave this
    # rank running: SIGTERM then, which a script may handle (monitors flush) before it exits. The rank's own
    # helpers are the subreapers' to stop (_proctree.sweep).
    _proctree.set_parent_death_signal(signal.SIGTERM)
    adopt_launcher_environment()
    args = sys.argv[1:]
    local_rank, module = True, False
    while args and args[0] in ("--no_local_rank", "--module", "--bind_cores"):
        flag = args.pop(0)
        if flag == "--bind_cores":
            bind_to_share(args.pop(0), [*(["--no_local_rank"] if not local_rank else []),
                                        *(["--module"] if module else []), *args])
        local_rank = local_rank and flag != "--no_local_rank"
        module = module or flag == "--module"
    target, rest = args[0], args[1:]
    # The script's folder first on sys.path, as `python SCRIPT` puts it (the working directory, as `python -m`
    # does), before anything looks for `deepspeed`: a deepspeed.py or deepspeed/ package beside the script is
    # the script's DeepSpeed, and the alias must see it to leave it alone.
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
    # An unchanged DeepSpeed script imports `deepspeed`: resolve it to dstrain where nothing else answers it.
    if os.environ.get(ALIAS_ENV, "1") != "0" and not deepspeed_answered():
        import dstrain.as_deepspeed  # noqa: F401
    if local_rank:
        rest = [f"--local_rank={os.environ.get('LOCAL_RANK', '0')}", *rest]
    sys.argv = [target, *rest]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")


def deepspeed_answered() -> bool:
    """Whether `import deepspeed` already has an answer, looked up on the path as the script sees it: a finder that
    serves it from dstrain (dstrain-deepspeed-compat's), an installed DeepSpeed, or one beside the script."""
    if any(getattr(finder, "root", None) == "deepspeed" for finder in sys.meta_path):
        return True
    return importlib.util.find_spec("deepspeed") is not None


if __name__ == "__main__":
    main()
