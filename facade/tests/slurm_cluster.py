"""A private one-node SLURM cluster (slurmctld + slurmd, Debian's slurm-wlm) for the launcher's tests.

Its own ports, state and spool folders and no munge (auth/none), so two test runs at once each have
their own; clients reach it through SLURM_CONF. It starts in about a second here. Both daemons run
in the foreground with a parent-death signal, so they never outlive the test process.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from dstrain.launcher import dies_with_parent

DAEMONS = ("slurmctld", "slurmd", "srun", "sinfo")


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    absent = [name for name in DAEMONS if shutil.which(name) is None]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} missing; Debian: apt-get install slurmctld slurmd "
                "slurm-client, as .ci/run does)")
    if os.geteuid() != 0:
        return "slurmd starts tasks as their user only when run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.started_in: float | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        node = socket.gethostname().split(".")[0]  # slurmd's own name for this machine
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        f = self.folder
        self.conf.write_text(f"""\
ClusterName=dstraintest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")

    def start(self, timeout: float = 60.0) -> None:
        began = time.monotonic()
        self.write_conf()
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            log = open(self.folder / f"{daemon[0]}.out", "wb")  # noqa: SIM115 (the daemon holds it)
            self.procs.append(subprocess.Popen([*daemon, "-f", str(self.conf)], stdout=log, stderr=log,
                                               stdin=subprocess.DEVNULL, env=self.env, start_new_session=True,
                                               preexec_fn=dies_with_parent(signal.SIGTERM)))
        while time.monotonic() - began < timeout:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env)
            if state.returncode == 0 and state.stdout.strip() in ("idle", "mixed"):
                self.started_in = time.monotonic() - began
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"SLURM daemon exited {proc.returncode}: {self.logs()}")
            time.sleep(0.2)
        raise RuntimeError(f"SLURM did not come up within {timeout:.0f} s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(self.folder.glob("*.out")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
