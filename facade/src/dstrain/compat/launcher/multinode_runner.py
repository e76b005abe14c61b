"""`deepspeed.launcher.multinode_runner`: DeepSpeed's runner classes, whose `get_cmd` gives the command line
dstrain's launcher runs for `--launcher openmpi|mpich|impi|mvapich|slurm` (dstrain.launcher.mpi): the same
layout, checks and quoting as `dstrain --launcher ...`.

Differences, by design:
- `add_export` keeps the value as given: dstrain passes variables to mpirun / srun as argv words (no shell reads
  them), and quotes with `shlex.quote` where a remote shell does (DeepSpeed's double quotes leave `$` and
  backquotes to the shell).
- `PDSHRunner.get_cmd` gives the command of one host only: dstrain starts one pdsh per node (each node has its
  own rank, slots and exit status), never one pdsh for every host with `%n`; for several hosts it names the
  `dstrain --launcher pdsh` command that starts them.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod

from ...launcher import mpi
from ...launcher.cli import job_for, mpi_job
from ...launcher.commands import ENV_NAME, ENV_NAME_RULE, node_argv, remote_shell_env
from ...launcher.errors import LaunchError


def _resources(active_resources: dict) -> dict[str, list[int]]:
    """{host: slot ids}, from DeepSpeed's active resources (slot ids) or its resource pool (slot counts)."""
    return {host: list(range(slots)) if isinstance(slots, int) else list(slots)
            for host, slots in active_resources.items()}


class MultiNodeRunner(ABC):
    """A way of starting every node of a job: `args` is the launcher's command line (`runner.parse_args`),
    `world_info_base64` the job's hosts and slots (`runner.encode_world_info`)."""

    def __init__(self, args, world_info_base64: str) -> None:
        self.args = args
        self.validate_args()
        self.user_arguments = self.parse_user_args()
        self.user_script = args.user_script
        self.world_info_base64 = world_info_base64
        self.exports: dict[str, str] = {}

    @abstractmethod
    def backend_exists(self):
        """Whether the program this runner starts is installed."""

    @abstractmethod
    def get_cmd(self, environment, active_resources):
        """The command that starts the job on `active_resources`."""

    def add_export(self, key: str, var: str) -> None:
        """Give every rank the variable `key` (a plain name) with the value `var`, kept as given (module doc)."""
        key = key.strip()
        if not ENV_NAME.fullmatch(key):
            raise LaunchError(f"add_export: {key!r} is not a variable name; {ENV_NAME_RULE}")
        self.exports[key] = var.strip()

    def parse_user_args(self) -> list[str]:
        return list(self.args.user_args)

    @property
    def name(self) -> str:
        return self.__class__.__name__

    def validate_args(self) -> None:  # noqa: B027 - DeepSpeed's hook: a subclass overrides it when it refuses args
        """Refuse what this runner cannot do with `self.args` (nothing, here)."""

    def world_info(self) -> dict[str, list[int]]:
        """The hosts and slots `world_info_base64` encodes."""
        return json.loads(base64.urlsafe_b64decode(self.world_info_base64))

    def _job(self, launcher: str, environment, active_resources):
        args = argparse.Namespace(**{**vars(self.args), "launcher": launcher})
        job = job_for(args, _resources(active_resources), True, environment)
        return args, type(job)(**{**job.__dict__, "extra_env": {**job.extra_env, **self.exports}})


class PDSHRunner(MultiNodeRunner):
    """pdsh, one per node (see the module's docstring)."""

    def backend_exists(self):
        return shutil.which("pdsh")

    @property
    def name(self) -> str:
        return "pdsh"

    def get_cmd(self, environment, active_resources):
        """(the pdsh command of the one host of `active_resources`, None, the environment pdsh runs in). No kill
        command (DeepSpeed's is a `pkill -f` by pattern on the node): the node agent stops the node when its pdsh
        ends, so stopping pdsh stops the node."""
        if len(active_resources) != 1:
            raise LaunchError(f"PDSHRunner: dstrain starts one pdsh per node (each with its own rank), so one "
                              f"command cannot start the {len(active_resources)} hosts "
                              f"{', '.join(active_resources)}; run `dstrain --launcher pdsh --hostfile FILE ...` "
                              "(or `deepspeed`), which starts and supervises every node")
        _, job = self._job("pdsh", environment, active_resources)
        node = job.nodes[0]
        node = type(node)(node.host, node.rank, node.slots, False)
        env = remote_shell_env("pdsh", self.args.ssh_port, environment) or dict(environment)
        env["PDSH_RCMD_TYPE"] = "ssh"
        return node_argv(job, node, "pdsh"), None, env


class _MpiRunner(MultiNodeRunner):
    flavour = ""

    def __init__(self, args, world_info_base64: str, resource_pool: dict | None = None) -> None:
        super().__init__(args, world_info_base64)
        self.resource_pool = resource_pool
        self._folder: str | None = None

    def backend_exists(self):
        return shutil.which(mpi.PROBE[self.flavour]) is not None and shutil.which(mpi.PROGRAM[self.flavour]) is not None

    @property
    def name(self) -> str:
        return self.flavour

    def _hostfile(self, mj: mpi.MpiJob) -> str | None:
        """Where this launcher's hostfile is written (a private folder, removed at exit), or None."""
        text = mpi.hostfile_text(mj)
        if text is None:
            return None
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="dstrain-hosts-")  # mode 0700
            atexit.register(shutil.rmtree, self._folder, True)
        path = os.path.join(self._folder, "hostfile")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            handle.write(text)
        return path

    def get_cmd(self, environment, active_resources) -> list[str]:
        """The mpirun / srun command that starts every rank, as `dstrain --launcher <name>` runs it."""
        args, job = self._job(self.flavour, environment, active_resources)
        mj = mpi_job(args, job, environment)
        return mpi.command(mj, self._hostfile(mj))


class OpenMPIRunner(_MpiRunner):
    flavour = "openmpi"


class MPICHRunner(_MpiRunner):
    flavour = "mpich"


class IMPIRunner(_MpiRunner):
    flavour = "impi"


class MVAPICHRunner(_MpiRunner):
    flavour = "mvapich"


class SlurmRunner(_MpiRunner):
    flavour = "slurm"


__all__ = ["IMPIRunner", "MPICHRunner", "MVAPICHRunner", "MultiNodeRunner", "OpenMPIRunner", "PDSHRunner",
           "SlurmRunner"]
