"""Starting torch.distributed the way jobs are launched: torchrun's environment, explicit ranks, or nothing.

A plain `python train.py` becomes a world of one with no environment needed; calling
`init_distributed` twice is harmless.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.util
import logging
import os
import traceback
import warnings

import torch
import torch.distributed as dist

from . import discovery
from .errors import CommError

log = logging.getLogger("dscomm")

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
_timeout: datetime.timedelta = DEFAULT_TIMEOUT
_shut_down_by: str | None = None  # the failure that made dscomm shut the process groups down


# The backends torch itself ships, each with how to ask whether this build has it.
_BUILT_IN = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available,
             "ucc": dist.is_ucc_available, "xccl": getattr(dist, "is_xccl_available", lambda: False)}
# DeepSpeed's names for backends a package registers with torch when imported (as DeepSpeed imports them).
_PLUGIN_PACKAGES = {"ccl": ("oneccl_bindings_for_pytorch", "Intel oneCCL"), "hccl": ("torch_npu", "Ascend HCCL")}


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def available_backends() -> list[str]:
    """The backends init_distributed can start in this process: torch's built into this build, then any
    a package registered (torch lists those in Backend.backend_list)."""
    built = [name for name, available in _BUILT_IN.items() if available()]
    registered = [name for name in dist.Backend.backend_list
                  if name not in _BUILT_IN and name not in ("undefined", "fake")]
    return built + registered


def _checked_backend(dist_backend: str) -> str:
    """`dist_backend`, or a CommError saying why this build cannot start it and what can. Each part of
    torch's 'cpu:gloo,cuda:nccl' form is checked; a package registering a DeepSpeed-named backend is imported."""
    if not isinstance(dist_backend, str) or not dist_backend.strip(" ,:"):
        raise CommError(f"init_distributed: dist_backend={dist_backend!r} is not a backend name; "
                        f"available here: {', '.join(available_backends())}")
    for part in dist_backend.split(","):
        name = part.rpartition(":")[2].strip().lower()
        if name in _BUILT_IN:
            if not _BUILT_IN[name]():
                raise CommError(_unavailable_message(dist_backend, name))
            continue
        if name not in dist.Backend.backend_list and name in _PLUGIN_PACKAGES:
            package, title = _PLUGIN_PACKAGES[name]
            if importlib.util.find_spec(package) is None:
                raise CommError(f"init_distributed: dist_backend={dist_backend!r}: {name!r} ({title}) is "
                                f"registered by the {package} package, which is not installed; install it, or "
                                f"use one of the backends available here: {', '.join(available_backends())}")
            importlib.import_module(package)  # registers the backend with torch
        if name not in dist.Backend.backend_list or name == "undefined":
            plugins = ", ".join(f"{n} (with {package})" for n, (package, _) in _PLUGIN_PACKAGES.items())
            raise CommError(f"init_distributed: unknown dist_backend {dist_backend!r}; valid names are "
                            f"{', '.join(_BUILT_IN)} (torch's, where the build has them), {plugins}; "
                            f"available here: {', '.join(available_backends())}")
    return dist_backend


def _unavailable_message(dist_backend: str, name: str) -> str:
    if name == "nccl":
        cpu_only = torch.version.cuda is None and torch.version.hip is None
        build = f"torch {torch.__version__} " + ("is a CPU-only build" if cpu_only else "was built without it")
        return (f"init_distributed: dist_backend={dist_backend!r}: NCCL is not available in this torch build "
                f"({build}); use dist_backend='gloo' to train on CPUs, or install a CUDA build of torch "
                f"(pytorch.org lists them) to train on GPUs. Available here: {', '.join(available_backends())}")
    return (f"init_distributed: dist_backend={dist_backend!r}: {name} is not available in this torch build "
            f"(torch {torch.__version__} was built without it); "
            f"use one of the backends available here: {', '.join(available_backends())}")


def init_distributed(dist_backend: str | None = None, timeout: datetime.timedelta | None = None,
                     init_method: str | None = None, rank: int = -1, world_size: int = -1, *,
                     distributed_port: int = 29500, dist_init_required: bool | None = None,
                     verbose: bool = True, auto_mpi_discovery: bool = True, config: object = None) -> None:
    """Join (or create) the default process group.

    Ranks come from the arguments, else from torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
    MASTER_ADDR / MASTER_PORT, else (with `auto_mpi_discovery`, as in DeepSpeed) from the variables an
    MPI launcher (OpenMPI, MPICH, Intel MPI, MVAPICH) or SLURM's srun sets, which are then exported as
    torch's (see dscomm.discovery; MASTER_PORT defaults to `distributed_port`), else the process is a
    world of one. The backend is nccl when CUDA is available and gloo otherwise. `verbose` and `config`
    are accepted for DeepSpeed compatibility.
    """
    global _timeout, _shut_down_by
    if dist.is_initialized():
        current = dist.get_backend()
        if dist_backend is not None and dist_backend != current:
            warnings.warn(f"init_distributed: already initialised with backend {current!r}; "
                          f"ignoring dist_backend={dist_backend!r}", stacklevel=2)
        return
    if dist_init_required is False:  # the caller promised a process group: there is none (DeepSpeed asserts)
        raise CommError("init_distributed(dist_init_required=False): torch.distributed is not initialized; "
                        "initialize it first, or pass dist_init_required=True (or leave it out)")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise CommError(f"timeout must be a datetime.timedelta, not {type(timeout).__name__} ({timeout!r})")
    _timeout = timeout or DEFAULT_TIMEOUT
    backend = _checked_backend(dist_backend) if dist_backend else default_backend()  # '' as before: the default
    if auto_mpi_discovery and rank < 0 and world_size < 0:
        _adopt_launcher_environment(distributed_port, verbose)
    rank, world_size = _ranks(rank, world_size, init_method)

    store = None
    if init_method is None:
        if world_size == 1 and "MASTER_ADDR" not in os.environ:
            store = dist.HashStore()  # a world of one needs no rendezvous
        else:
            _require_rendezvous_env(rank, world_size, distributed_port)
            init_method = "env://"
    where = init_method or "an in-process store"
    try:
        dist.init_process_group(backend, init_method=init_method, timeout=_timeout, world_size=world_size,
                                rank=rank, store=store)
    except (RuntimeError, ValueError) as exc:
        raise CommError(
            f"rank {rank} of {world_size} could not join the process group (backend {backend}) at {where} within "
            f"{_timeout}: {_first_line(exc)}. Did every rank start, with the same world size and address?") from exc
    _shut_down_by = None
    if backend == "nccl":
        torch.cuda.set_device(get_local_rank())
    if verbose and rank == 0:
        log.info("dscomm: initialised %s with %d rank(s) via %s", backend, world_size, where)


def _adopt_launcher_environment(distributed_port: int, verbose: bool) -> None:
    """Export an MPI or SLURM launcher's ranks as torch's variables, as DeepSpeed's MPI discovery does
    (from the environment alone: no mpi4py)."""
    if discovery.has_torch_environment(os.environ):
        return
    try:
        found = discovery.discover(os.environ, distributed_port)
    except ValueError as exc:
        raise CommError(f"init_distributed: cannot read this process's rank from its launcher: {exc}") from None
    if found is None:
        return
    exported = found.torch_environment()
    if found.world_size == 1 and "MASTER_ADDR" not in os.environ:  # a world of one needs no port (none to collide)
        exported = {k: v for k, v in exported.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(exported)
    if verbose and found.rank == 0:
        log.info("dscomm: %s launched %d rank(s); rendezvous at %s:%d", found.source, found.world_size,
                 found.master_addr, found.master_port)


def _ranks(rank: int, world_size: int, init_method: str | None) -> tuple[int, int]:
    env = os.environ
    if rank < 0 and "RANK" in env:
        rank = _env_int("RANK")
    if world_size < 0 and "WORLD_SIZE" in env:
        world_size = _env_int("WORLD_SIZE")
    if rank < 0 and world_size < 0:
        if init_method is not None and not init_method.startswith("env://"):
            raise CommError(f"init_method {init_method!r} needs rank and world_size (or RANK and WORLD_SIZE)")
        return 0, 1
    if rank < 0 or world_size < 0:
        missing = "rank (or RANK)" if rank < 0 else "world_size (or WORLD_SIZE)"
        raise CommError(f"init_distributed: {missing} is not set while the other is; set both")
    if not 0 <= rank < world_size:
        raise CommError(f"init_distributed: rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    return rank, world_size


def _require_rendezvous_env(rank: int, world_size: int, port: int) -> None:
    if world_size == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise CommError(f"rank {rank} of {world_size}: {' and '.join(missing)} not set; launch with torchrun "
                        f"(or dstrain), or pass init_method")


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise CommError(f"environment variable {name}={value!r} is not an integer") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank(group=None) -> int:
    return dist.get_rank(group) if is_initialized() else 0


def get_world_size(group=None) -> int:
    return dist.get_world_size(group) if is_initialized() else 1


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def get_backend(group=None) -> str:
    return dist.get_backend(group) if is_initialized() else default_backend()


def collective_device(group=None) -> torch.device:
    """Where tensors handed to the group's collectives must live: the current GPU for NCCL (it moves device
    memory only), else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_timeout() -> datetime.timedelta:
    return _timeout


def set_timeout(timeout: datetime.timedelta) -> None:
    """Give the default group's collectives `timeout` from now on (joining may have needed longer)."""
    global _timeout
    if not isinstance(timeout, datetime.timedelta):
        raise CommError(f"timeout must be a datetime.timedelta, not {type(timeout).__name__} ({timeout!r})")
    if is_initialized():
        dist.group.WORLD.set_timeout(timeout)
    _timeout = timeout


def destroy(synchronize: bool = True) -> None:
    """Leave the process group and forget every group dscomm created.

    synchronize: first wait at a barrier for every rank to get here, so no rank tears its gloo
    connections down while a peer still finishes its last collective. The failure path passes False:
    its peers are gone. (The abort once seen at the exit of such scripts under load came from a gloo
    worker freeing a tensor during finalization; exit_settle.py handles that.)
    """
    from . import groups, watchdog

    groups.reset()
    if is_initialized():
        if synchronize and dist.get_world_size() > 1:
            with contextlib.suppress(Exception):  # a peer already gone: leave anyway
                dist.barrier()
        watchdog.stop()  # this rank leaves on purpose: its peers stop watching it
        dist.destroy_process_group()


def shut_down_after_failure(failure: str, exc: BaseException) -> bool:
    """A peer is gone or never answered: leave every process group now, before the error propagates.

    After a timeout gloo has closed the group's connections, so the groups are of no further use.
    Left alone they stay alive through the traceback, their worker threads still there while the
    interpreter shuts down: the path on which a run with a stopped rank once aborted with
    `terminate called without an active exception`. So torch's frames in the traceback let go of
    the group and its work, and the groups are destroyed here, with the interpreter whole.
    NCCL is left to torch's own watchdog (which tears a timed-out job down): destroying a NCCL
    group whose peer hangs can block. Returns whether the groups were shut down.
    """
    global _shut_down_by
    if not is_initialized() or "nccl" in str(dist.get_backend()):
        return False
    if exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)  # the frames still running (ours) are left as they are
    _shut_down_by = failure
    with contextlib.suppress(Exception):  # already failing: the failure is the error to report
        destroy(synchronize=False)
    return True


def shut_down_by() -> str | None:
    """The failure after which dscomm shut the process groups down, until init_distributed starts again."""
    return _shut_down_by
