"""Start one node agent per node (locally or over ssh/pdsh), watch them, and stop them all together.

The job ends when every node has exited 0, when any node fails (the others are stopped and the
failing node's exit code is returned), or when the launcher receives SIGINT, SIGTERM or SIGHUP
(everything is stopped and 128 + signal is returned). Stopping closes each node's stdin and sends
it SIGTERM; its agent stops its ranks and exits; whatever still runs after the grace period is
killed from a snapshot of the process tree.

The launcher is a child subreaper while it runs a job: when a node agent dies (even by SIGKILL), its
keeper, torchrun and the ranks are re-parented here rather than to init, and the launcher does not
return before they are gone (it SIGTERMs what it adopts, SIGKILLs what is left after the grace
period). Each node process has a parent-death signal (SIGTERM), so a launcher that dies stops its
nodes too: the agents also watch their stdin, whose other end only the launcher holds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import _proctree
from .commands import Job, Node, node_argv, node_env, pdsh_argv, remote_shell_env, ssh_argv
from .errors import LaunchError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _say(message: str) -> None:
    print(f"dstrain: {message}", file=sys.stderr, flush=True)


def check_reachable(hosts: list[str], remote_shell: str, ssh_port: int | None = None,
                    timeout: float = 15.0, options: tuple[str, ...] = ()) -> None:
    """Run `true` on every remote host at once; one error lists each host that cannot be reached."""
    if not hosts:
        return
    if shutil.which(remote_shell) is None:
        raise LaunchError(f"{remote_shell!r} is not installed, and is needed to reach {', '.join(hosts)}; "
                          "install it, or list only localhost in the hostfile, or use --launcher local")

    def probe(host: str) -> str | None:
        argv = (pdsh_argv(host, "true", options) if remote_shell == "pdsh"
                else ssh_argv(host, "true", ssh_port, ("-o", "ConnectTimeout=10", *options)))
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                                  env=remote_shell_env(remote_shell, ssh_port))
        except subprocess.TimeoutExpired:
            return f"{host}: no answer within {timeout:.0f} s"
        if done.returncode == 0:
            return None
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        return f"{host}: {remote_shell} exited {done.returncode}: {lines[-1] if lines else 'no message'}"

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        failures = [f for f in pool.map(probe, hosts) if f]
    if failures:
        raise LaunchError("cannot reach these hosts with non-interactive " + remote_shell + ":\n  "
                          + "\n  ".join(failures)
                          + "\ncheck that `ssh HOST true` works without a password prompt (keys, known_hosts)")


def _pump(stream, sink, tag: bytes) -> None:
    """Copy `stream` to `sink` line by line, each line prefixed with `tag`."""
    out = getattr(sink, "buffer", sink)
    for line in iter(stream.readline, b""):
        try:
            out.write(tag + line)
            out.flush()
        except (OSError, ValueError):
            pass  # our own output is gone (closed terminal); keep draining so the node never blocks
    stream.close()


@dataclass(frozen=True)
class Launch:
    """One process the launcher starts and watches: a node's agent (here, or over ssh / pdsh), or the
    job's one mpirun / srun (`--launcher openmpi|mpich|impi|mvapich|slurm`)."""

    name: str  # in messages: "node 1 (worker-1)", "mpirun"
    tag: str  # the prefix of its output lines when several run at once
    argv: tuple[str, ...]
    env: dict[str, str] | None = None  # its whole environment; None: the launcher's own
    hint_255: str | None = None  # what exit code 255 means for it (ssh's own failure)


def node_launches(job: Job, nodes: list[Node] | None = None, remote_shell: str = "ssh",
                  ssh_port: int | None = None) -> list[Launch]:
    """One launch per node: its agent, as a child here or through ssh / pdsh."""
    launches = []
    for node in list(job.nodes) if nodes is None else nodes:
        env = {**os.environ, **node_env(job, node)} if node.local else remote_shell_env(remote_shell, ssh_port)
        hint = (f"exit code 255 is ssh's own: the connection to {node.host} failed or dropped"
                if not node.local and remote_shell == "ssh" else None)
        launches.append(Launch(f"node {node.rank} ({node.host})", f"[node{node.rank} {node.host}] ",
                               tuple(node_argv(job, node, remote_shell, ssh_port)), env, hint))
    return launches


class Supervisor:
    """Owns the processes of one job: the node agents, or the one mpirun / srun."""

    def __init__(self, launches: list[Launch], cwd: str, grace: float = 10.0, elastic_min_nodes: int | None = None
                 ) -> None:
        self.launches = launches
        self.cwd = cwd
        self.grace = grace
        # --elastic_training: a node that fails is let go while this many still run (their agents restart the
        # ranks without it); below it the job fails as any other.
        self.elastic_min_nodes = elastic_min_nodes
        self.procs: list[tuple[Launch, subprocess.Popen]] = []
        self._stop = threading.Event()
        self._signal: int | None = None
        self._pumps: list[threading.Thread] = []
        # Several nodes write to one terminal: prefix their lines, as pdsh does, to keep them apart.
        self.prefix = len(self.launches) > 1

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._signal is None:
            self._signal = signum
        self._stop.set()

    def start(self) -> None:
        for launch in self.launches:
            try:
                # A session of its own: a Ctrl-C in the terminal reaches only the launcher, which
                # then stops every node the same way, whatever shell or tty it was started from.
                out = subprocess.PIPE if self.prefix else None
                proc = subprocess.Popen(list(launch.argv), stdin=subprocess.PIPE, stdout=out, stderr=out,
                                        env=launch.env, cwd=self.cwd, start_new_session=True,
                                        preexec_fn=_proctree.dies_with_parent(signal.SIGTERM))
            except OSError as exc:
                self.stop()
                raise LaunchError(f"cannot start {launch.name}: {exc}") from exc
            self.procs.append((launch, proc))
            if self.prefix:
                tag = launch.tag.encode()
                for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                    pump = threading.Thread(target=_pump, args=(stream, sink, tag), daemon=True)
                    pump.start()
                    self._pumps.append(pump)

    def wait(self) -> int:
        """Block until the job ends; return its exit code."""
        failed: tuple[Launch, int] | None = None
        let_go: set[str] = set()
        while not self._stop.wait(0.1):
            codes = [(launch, proc.poll()) for launch, proc in self.procs]
            failures = [(n, c) for n, c in codes if c not in (None, 0) and n.name not in let_go]
            running = sum(c is None for _, c in codes)
            if failures and self.elastic_min_nodes is not None and running >= self.elastic_min_nodes:
                for launch, code in failures:
                    _say(f"{launch.name} exited with code {code}; elastic training goes on with the {running} "
                         f"running node(s)")
                    let_go.add(launch.name)
                failures = []
            failed = failures[0] if failures else None
            if failed is not None or all(c is not None for _, c in codes):
                if failed is None and not any(c == 0 for _, c in codes):  # every node failed, the last let go
                    failed = next((n, c) for n, c in codes if c != 0)
                break
        if self._signal is not None:
            _say(f"received {signal.Signals(self._signal).name}; stopping every node")
            self.stop()
            return 128 + self._signal
        if failed is not None:
            launch, code = failed
            code = 128 - code if code < 0 else code
            if len(self.procs) > 1:
                _say(f"{launch.name} exited with code {code}; stopping the other nodes")
            if code == 255 and launch.hint_255:
                _say(f"({launch.hint_255})")
            self.stop()
            return code
        self.stop()  # sweeps anything a finished node left behind
        return 0

    def stop(self) -> None:
        # Before signalling: afterwards the links break. What we adopted (a killed agent's keeper,
        # torchrun, ranks) is below us too.
        tree = _proctree.descendants(os.getpid())
        for _, proc in self.procs:
            if proc.poll() is None:
                try:
                    if proc.stdin:
                        proc.stdin.close()  # the agent (or the remote one, through ssh) sees EOF
                    proc.terminate()
                except OSError:
                    pass
        # Each node stops its own tree; anything re-parented to us (its node agent died) gets SIGTERM at once.
        killed = _proctree.sweep(tree, self.grace + 5.0, own=tuple(proc.pid for _, proc in self.procs))
        if killed:
            _say(f"{len(killed)} process(es) did not stop within {self.grace + 5.0:.0f} s; killed them")
        for _, proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pump in self._pumps:
            pump.join(timeout=2)

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        _proctree.become_subreaper()  # orphans of the job come to us, not to init (see the module's docstring)
        try:
            self.start()
            return self.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
