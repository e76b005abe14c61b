"""The command lines the launcher runs: torchrun for one node, wrapped in the node agent, wrapped in
ssh or pdsh for a remote node. Pure functions over plain data, so they are tested without processes.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LaunchError
from .hostfile import check_host

HERE = Path(__file__).resolve().parent
NODE_AGENT = str(HERE / "_node.py")
RANK_ENTRY = str(HERE / "_rank.py")

# Variables every node's ranks need to see the same (DeepSpeed exports NCCL*, PYTHON*, UCX*, MV2*).
EXPORT_PREFIXES = ("NCCL", "PYTHON", "UCX", "MV2", "MLFLOW", "FI_", "GLOO_", "TORCH_", "OMP_", "DSTRAIN_", "DSAIO_")
ENV_FILES = (".deepspeed_env", ".dstrain_env")  # KEY=VALUE lines for every node, from ~ and the cwd
ENV_FILE_VARIABLE = "DS_ENV_FILE"  # DeepSpeed's: another name (or path) for .deepspeed_env
LOOPBACK = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}
# Names go unquoted into a remote node's shell line (`env NAME=value`): only plain names are safe there.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_RULE = "a variable name is letters, digits and '_', not starting with a digit: [A-Za-z_][A-Za-z0-9_]*"


@dataclass(frozen=True)
class Node:
    host: str
    rank: int
    slots: tuple[int, ...]
    local: bool  # run as a child of the launcher, without ssh


@dataclass(frozen=True)
class Elastic:
    """--elastic_training: each node's torchrun joins one c10d rendezvous and restarts its ranks when nodes come
    or go (torch's elastic agent, as DeepSpeed's DSElasticAgent)."""

    min_nodes: int
    max_nodes: int
    run_id: str  # the rendezvous every node of the job joins (DeepSpeed's ELASTIC_RUN_ID)
    rdzv_conf: str = ""  # torchrun's --rdzv_conf, checked
    max_restarts: int = 100  # membership changes (and failures) a node's agent restarts its ranks for: DeepSpeed's


@dataclass(frozen=True)
class Job:
    script: str
    script_args: tuple[str, ...]
    nodes: tuple[Node, ...]
    master_addr: str
    master_port: int | None  # None: one node on a free port (torchrun's standalone rendezvous)
    python: str
    cwd: str
    local_rank_arg: bool = True  # append --local_rank=N as DeepSpeed does
    module: bool = False  # run the script as `python -m`
    set_visible_devices: bool = True  # CUDA_VISIBLE_DEVICES = the node's slots
    extra_env: dict[str, str] = field(default_factory=dict)
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL when stopping
    bind_cores: str | None = None  # pin each rank to its share of these cores ('all' or a core list)
    launcher_args: tuple[str, ...] = ()  # --launcher_args, split: options for ssh / pdsh / mpirun / srun
    elastic: Elastic | None = None  # --elastic_training


def is_local_host(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.") or host == socket.gethostname()


def torchrun_argv(job: Job, node: Node) -> list[str]:
    wrapper_flags = ((["--no_local_rank"] if not job.local_rank_arg else []) + (["--module"] if job.module else [])
                     + (["--bind_cores", job.bind_cores] if job.bind_cores is not None else []))
    if job.elastic is not None:
        # Nodes come and go: one rendezvous at the master for every round, ranks numbered by it (no node rank).
        elastic = job.elastic
        layout = [f"--nnodes={elastic.min_nodes}:{elastic.max_nodes}", f"--nproc_per_node={len(node.slots)}",
                  "--rdzv_backend=c10d", f"--rdzv_endpoint={job.master_addr}:{job.master_port}",
                  f"--rdzv_id={elastic.run_id}", *([f"--rdzv_conf={elastic.rdzv_conf}"] if elastic.rdzv_conf else []),
                  f"--max_restarts={elastic.max_restarts}"]
    else:
        if job.master_port is None:
            # The rendezvous store listens on a port the system picks, so jobs on one machine never collide.
            rendezvous = ["--standalone", f"--local_addr={job.master_addr}"]
        else:
            rendezvous = [f"--master_addr={job.master_addr}", f"--master_port={job.master_port}"]
        layout = [f"--nnodes={len(job.nodes)}", f"--node_rank={node.rank}", f"--nproc_per_node={len(node.slots)}",
                  *rendezvous, "--max_restarts=0"]  # a failed rank fails the job, as with DeepSpeed's launcher
    return [job.python, "-u", "-m", "torch.distributed.run", *layout,
            RANK_ENTRY, *wrapper_flags, job.script, *job.script_args]


def node_env(job: Job, node: Node) -> dict[str, str]:
    """Variables this node's processes get on top of the environment they start in."""
    env = dict(job.extra_env)
    if job.elastic is not None:
        # torch 2.13's elastic agent shares its rendezvous store with the ranks; a node that stays rank 0 across a
        # membership change then never publishes the new round's master address, and a node joining waits for it
        # until its timeout. Unshared, every round publishes it (the ranks' own store is then a new one).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if job.set_visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.slots))
    return env


def agent_argv(job: Job, node: Node) -> list[str]:
    return supervised(job, torchrun_argv(job, node))


def supervised(job: Job, argv: list[str]) -> list[str]:
    """`argv` run by the node agent, which stops it and whatever it leaves when the launcher dies (see _node.py)."""
    return [job.python, "-u", NODE_AGENT, "--watch-stdin", "--grace", str(job.grace), "--", *argv]


def remote_command(job: Job, node: Node) -> str:
    """The shell line a remote node runs: same directory, exported variables, then the agent."""
    assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(node_env(job, node).items())]
    return (f"cd {shlex.quote(job.cwd)} && exec env {' '.join(assignments)} "
            + " ".join(shlex.quote(a) for a in agent_argv(job, node)))


def ssh_argv(host: str, command: str, ssh_port: int | None = None, options: tuple[str, ...] = ()) -> list[str]:
    """`options`: ssh's own (--launcher_args), before the host."""
    port = ["-p", str(ssh_port)] if ssh_port else []
    # BatchMode: fail at once instead of prompting for a password nobody can type. '--': whatever
    # the host is called, ssh never reads it as an option.
    return ["ssh", "-o", "BatchMode=yes", *options, *port, "--", check_host(host, "host"), command]


def pdsh_argv(host: str, command: str, options: tuple[str, ...] = ()) -> list[str]:
    """`options`: pdsh's own (--launcher_args), after the host as DeepSpeed puts them."""
    # One host per pdsh so each node gets its own rank and exit code (-S); the ssh port comes from
    # remote_shell_env (--ssh_port) or ~/.ssh/config, the user from ~/.ssh/config.
    # pdsh reads -w as a host list ('^file', '-host', '/regex/'): checking the name keeps it one host.
    return ["pdsh", "-S", "-R", "ssh", "-w", check_host(host, "host"), *options, command]


def remote_shell_env(remote_shell: str, ssh_port: int | None, environ: dict[str, str] | None = None
                     ) -> dict[str, str] | None:
    """The environment ssh / pdsh run in: pdsh takes the ssh port from PDSH_SSH_ARGS_APPEND, as DeepSpeed
    sets it; None (the launcher's own) otherwise."""
    if remote_shell != "pdsh" or not ssh_port:
        return None
    environ = dict(os.environ if environ is None else environ)
    environ["PDSH_SSH_ARGS_APPEND"] = f"{environ.get('PDSH_SSH_ARGS_APPEND', '')} -p {int(ssh_port)}".strip()
    return environ


def exported_environment(environ: dict[str, str], home: str | None = None, cwd: str | None = None) -> dict[str, str]:
    """What every node gets from here: prefixed variables, then `.dstrain_env` / `.deepspeed_env` lines."""
    env = {k: v for k, v in environ.items() if k.startswith(EXPORT_PREFIXES)}
    for key in env:
        if not ENV_NAME.fullmatch(key):
            raise LaunchError(f"environment variable {key!r} cannot be passed to other nodes: {ENV_NAME_RULE}; "
                              "unset it or rename it")
    names = (environ.get(ENV_FILE_VARIABLE) or ENV_FILES[0], *ENV_FILES[1:])
    for folder in (home or os.path.expanduser("~"), cwd or os.getcwd()):  # the job's folder wins
        for name in names:
            path = Path(folder) / name
            if path.is_file():
                env.update(read_env_file(path))
    return env


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=VALUE` lines (`#` comments, blank lines skipped); the value is taken verbatim, spaces inside kept."""
    env: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise LaunchError(f"{path}:{number}: {line!r}: expected KEY=VALUE")
        key, value = (part.strip() for part in line.split("=", 1))
        if not ENV_NAME.fullmatch(key):
            raise LaunchError(f"{path}:{number}: {key!r} is not a variable name; {ENV_NAME_RULE}")
        env[key] = value
    return env


def node_argv(job: Job, node: Node, remote_shell: str = "ssh", ssh_port: int | None = None) -> list[str]:
    """What the launcher runs for `node`: the agent itself, or ssh/pdsh running it remotely."""
    if node.local:
        return agent_argv(job, node)
    command = remote_command(job, node)
    if remote_shell == "pdsh":
        return pdsh_argv(node.host, command, job.launcher_args)
    return ssh_argv(node.host, command, ssh_port, job.launcher_args)


def node_argv_display(job: Job, node: Node, remote_shell: str = "ssh", ssh_port: int | None = None) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(node_env(job, node).items())) if node.local else ""
    return (env + " " if env else "") + shlex.join(node_argv(job, node, remote_shell, ssh_port))
