"""The `dstrain` launcher end to end: real torchrun, real ranks on gloo, real signals.

Each test tags its job with a marker in the environment and, after the launcher returns, looks
through /proc for any process still carrying it: an orphan fails the test (and is then killed).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dstrain.launcher.cli import main

SCRIPTS = Path(__file__).parent / "launch_scripts"
MARKER = "DSTRAIN_TEST_MARKER"
TIMEOUT = 120  # a hang fails the test instead of blocking the suite


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tagged_processes(tag: str) -> list[int]:
    """Pids of live processes whose environment carries our marker (zombies have no environment)."""
    needle = f"{MARKER}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found


class Launches:
    """Starts `dstrain ...` in one folder, every job tagged with the same marker in its environment."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, MARKER: self.tag, "PYTHONUNBUFFERED": "1"}
        self.env.pop("CUDA_VISIBLE_DEVICES", None)
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str, extra_env: dict[str, str] | None = None, port: bool = True) -> subprocess.Popen:
        """`port=False`: no --master_port, so a job on one machine finds a free one itself."""
        cmd = [sys.executable, "-m", "dstrain.launcher", *(["--master_port", str(free_port())] if port else []), *args]
        proc = subprocess.Popen(cmd, cwd=self.folder, env={**self.env, **(extra_env or {})}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started.append(proc)
        return proc

    def run(self, *args: str, extra_env: dict[str, str] | None = None, port: bool = True) -> subprocess.CompletedProcess:
        proc = self.start(*args, extra_env=extra_env, port=port)
        out, err = proc.communicate(timeout=TIMEOUT)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def job(tmp_path):
    """Launches in tmp_path; afterwards no process may carry the marker (any that does is killed)."""
    launches = Launches(tmp_path)
    yield launches
    for proc in launches.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = orphans(launches.tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def orphans(tag: str, settle: float = 1.0) -> list[int]:
    deadline = time.monotonic() + settle  # a SIGKILLed process may take a moment to become a zombie
    left = tagged_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = tagged_processes(tag)
    return left


def ranks(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


def wait_for_files(folder: Path, names: list[str], proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all((folder / n).exists() for n in names):
        assert proc.poll() is None, f"launcher exited early ({proc.returncode}): {proc.communicate()[1]}"
        assert time.monotonic() < deadline, f"ranks did not start: {os.listdir(folder)}"
        time.sleep(0.05)


@pytest.mark.parametrize("local_rank_arg", [True, False], ids=["local_rank", "no_local_rank"])
def test_one_process(job, tmp_path, local_rank_arg):
    flags = [] if local_rank_arg else ["--no_local_rank"]
    done = job.run("--num_procs", "1", *flags, str(SCRIPTS / "report_env.py"), "--lr", "0.1", str(tmp_path))
    assert done.returncode == 0, done.stderr
    seen = ranks(tmp_path)
    first = ["--local_rank=0"] if local_rank_arg else []
    assert seen[0]["argv"] == [*first, "--lr", "0.1", str(tmp_path)]  # DeepSpeed's order: local rank first
    assert seen[0]["env"] == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}


def test_two_processes_all_reduce(job, tmp_path):
    done = job.run("--num_procs", "2", str(SCRIPTS / "allreduce.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr
    seen = ranks(tmp_path)
    assert sorted(seen) == [0, 1]
    for rank, r in seen.items():
        assert (r["world"], r["sum"]) == (2, 3.0)
        assert r["argv"][0] == f"--local_rank={rank}"
        assert r["env"]["LOCAL_RANK"] == str(rank)


def test_two_nodes_over_loopback(job, tmp_path):
    """Two 'machines' from a hostfile, one torchrun each, meeting at the rendezvous over loopback."""
    (tmp_path / "hostfile").write_text("# two nodes on this machine\nlocalhost slots=1\n\n127.0.0.1 slots=1\n")
    done = job.run("--hostfile", "hostfile", str(SCRIPTS / "allreduce.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr
    seen = ranks(tmp_path)
    assert sorted(seen) == [0, 1]
    for r in seen.values():
        assert (r["world"], r["sum"]) == (2, 3.0)
        assert r["argv"][0] == "--local_rank=0"  # one process per node
        assert r["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert "[node0 localhost] rank 0: all_reduce sum 3.0" in done.stdout  # each node's lines are tagged
    assert "[node1 127.0.0.1] rank 1: all_reduce sum 3.0" in done.stdout


def test_dying_rank_stops_every_node(job, tmp_path):
    """Rank 1 exits 7 while rank 0 (on the other node) would wait forever: the job ends, non-zero, clean."""
    (tmp_path / "hostfile").write_text("node-a slots=1\nnode-b slots=1\n")  # --launcher local: no ssh
    start = time.monotonic()
    done = job.run("--hostfile", "hostfile", "--launcher", "local", str(SCRIPTS / "hang.py"), str(tmp_path),
                   extra_env={"DIE_RANK": "1"})
    assert done.returncode != 0
    assert "node 1 (node-b) exited" in done.stderr
    assert time.monotonic() - start < 60
    assert not orphans(job.tag)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_launcher_stops_everything(job, tmp_path, sig):
    proc = job.start("--num_procs", "2", str(SCRIPTS / "hang.py"), str(tmp_path))
    wait_for_files(tmp_path, ["started.0", "started.1"], proc)
    assert len(tagged_processes(job.tag)) >= 7  # launcher, agent, torchrun, 2 ranks, 2 helpers
    proc.send_signal(sig)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + sig
    assert not orphans(job.tag)


def test_killed_launcher_leaves_nothing(job, tmp_path):
    """Even SIGKILL (no chance to clean up): each node agent sees its stdin close and stops its node."""
    (tmp_path / "hostfile").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    proc = job.start("--hostfile", "hostfile", "--stop_grace", "3", str(SCRIPTS / "hang.py"), str(tmp_path))
    wait_for_files(tmp_path, ["started.0", "started.1"], proc)
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    assert not orphans(job.tag, settle=15)


def children(pid: int) -> list[int]:
    """Pids whose parent is `pid`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if int(data[data.rfind(b")") + 2 :].split()[1]) == pid:
                found.append(int(name))
    return found


# A killed node agent, keeper or torchrun, and a killed tuner: test_process_lifetime.py.


# The two error cases start no process, so they call the command's main() here: no torch start-up.

@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs an ssh client")
def test_unreachable_host_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    code = main(["--hostfile", "hostfile", "--launcher", "ssh", str(SCRIPTS / "report_env.py"), str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot reach" in err and "no-such-host.invalid" in err
    assert not list(tmp_path.glob("rank*.json"))  # nothing was started, not even the local node


def test_bad_hostfile_is_an_error_naming_the_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostfile").write_text("localhost slots=1\nlocalhost slots=2\n")
    code = main(["--hostfile", "hostfile", str(SCRIPTS / "report_env.py")])
    err = capsys.readouterr().err
    assert code == 2
    assert "hostfile:2" in err and "listed twice (first on line 1)" in err


# Hostile input: nothing from a hostfile or an env file may reach ssh as an option or run in a remote shell.

@pytest.mark.parametrize("kind", ["-oProxyCommand", "-F"])
def test_option_like_host_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, kind):
    """With real ssh, `-Fconfig` read ./config and ran its ProxyCommand while only checking that hosts are reachable."""
    monkeypatch.chdir(tmp_path)
    touched = tmp_path / "proxy_command_ran"
    payload = tmp_path / "payload.sh"
    payload.write_text(f"#!/bin/sh\ntouch {touched}\n")
    payload.chmod(0o755)
    (tmp_path / "evil_config").write_text(f"Host *\n  ProxyCommand {payload}\n")
    host = f"-oProxyCommand={payload}" if kind == "-oProxyCommand" else "-Fevil_config"  # relative to the cwd
    (tmp_path / "hostfile").write_text(f"localhost slots=1\n{host} slots=1\n")
    code = main(["--hostfile", "hostfile", "--launcher", "ssh", str(SCRIPTS / "report_env.py"), str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"hostfile:2: '{host} slots=1': {host!r} is not a host name" in err
    assert "IPv4" in err and "IPv6" in err  # says what is valid
    assert not touched.exists()
    assert not list(tmp_path.glob("rank*.json"))


@pytest.fixture
def fake_ssh(tmp_path):
    """An `ssh` first on PATH that runs the remote line with `sh -c` here; its log lists the hosts it got."""
    folder = tmp_path / "fake_bin"
    folder.mkdir()
    (folder / "ssh").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                                f"{shlex.quote(str(SCRIPTS / 'fake_ssh.py'))} \"$@\"\n")
    (folder / "ssh").chmod(0o755)
    log = tmp_path / "ssh.log"
    return {"PATH": f"{folder}:{os.environ['PATH']}", "FAKE_SSH_LOG": str(log)}, log


def test_env_file_key_that_is_not_a_name_is_refused(job, tmp_path, fake_ssh):
    """`X$(cmd)=1` used to run cmd on the remote node, unquoted in its shell line."""
    env, log = fake_ssh
    touched = tmp_path / "key_command_ran"
    (tmp_path / ".deepspeed_env").write_text(f"GOOD=1\nX$(touch {touched})=1\n")
    (tmp_path / "hostfile").write_text("node-a slots=1\n")
    done = job.run("--hostfile", "hostfile", "--launcher", "ssh", "--master_addr", "127.0.0.1",
                   str(SCRIPTS / "report_env.py"), str(tmp_path), extra_env=env)
    assert done.returncode == 2
    assert f"{tmp_path / '.deepspeed_env'}:2: " in done.stderr
    assert f"'X$(touch {touched})' is not a variable name" in done.stderr
    assert not touched.exists() and not log.exists()  # refused before ssh was ever started


def test_remote_node_gets_values_script_and_arguments_verbatim(job, tmp_path, fake_ssh):
    """Everything on a remote node's shell line is quoted: shell syntax in any of it arrives as text."""
    env, log = fake_ssh
    marks = tmp_path / "marks"
    marks.mkdir()
    values = {"SPACES": "a  b   c", "QUOTES": "it's \"double\" and 'single'", "SUBST": f"$(touch {marks}/subst)",
              "TICKS": f"`touch {marks}/ticks`", "SEMI": f"x; touch {marks}/semi", "EMPTY": ""}
    (tmp_path / ".deepspeed_env").write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    folder = tmp_path / "scripts $(cd marks && touch folder) 'q'"  # a file name holds no '/'
    folder.mkdir()
    script = folder / "report_environ.py"
    shutil.copy(SCRIPTS / "report_environ.py", script)
    args = ["two words", f"$(touch {marks}/arg)", "it's", "a;b", "*", str(tmp_path)]
    (tmp_path / "hostfile").write_text("node-a slots=1\n")
    done = job.run("--hostfile", "hostfile", "--launcher", "ssh", "--master_addr", "127.0.0.1",
                   str(script), *args, extra_env=env)
    assert done.returncode == 0, done.stderr
    assert log.read_text().split() == ["node-a", "node-a"]  # the reachability probe, then the node
    seen = ranks(tmp_path)[0]
    assert seen["script"] == str(script)
    assert seen["argv"] == ["--local_rank=0", *args]
    assert {k: seen["environ"].get(k) for k in values} == values
    assert not list(marks.iterdir())


def test_two_jobs_at_once_on_one_machine(job, tmp_path):
    """Without --master_port each single-machine job finds a free port (it was 29500 for all, so the
    second job died with EADDRINUSE). Every rank waits for all four, so the jobs surely overlap."""
    jobs = {name: job.start("--num_procs", "2", str(SCRIPTS / "meet.py"), name, "4", str(tmp_path), port=False)
            for name in ("first", "second")}
    for name, proc in jobs.items():
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.rank*.json")}
    assert sorted(seen) == ["first.rank0", "first.rank1", "second.rank0", "second.rank1"]
    assert all((r["sum"], r["world"]) == (3.0, 2) for r in seen.values())
    assert seen["first.rank0"]["port"] != seen["second.rank0"]["port"]


# Core binding: each rank runs on its own share of the cores, with as many OpenMP threads.

CORES = sorted(os.sched_getaffinity(0))


def _expected_shares(cores: list[int], nprocs: int) -> list[list[int]]:
    per_rank = len(cores) // nprocs
    return [cores[r * per_rank : (r + 1) * per_rank] for r in range(nprocs)]


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to give 2 ranks one each")
def test_bind_cores_to_rank_gives_each_rank_its_share(job, tmp_path):
    done = job.run("--num_procs", "2", "--bind_cores_to_rank", str(SCRIPTS / "report_affinity.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr
    seen = ranks(tmp_path)
    shares = _expected_shares(CORES, 2)
    for rank in (0, 1):
        assert seen[rank]["cores"] == shares[rank]
        assert seen[rank]["omp"] == str(len(shares[rank]))
        assert seen[rank]["argv"] == [f"--local_rank={rank}", str(tmp_path)]
    assert not set(shares[0]) & set(shares[1])


@pytest.mark.skipif(0 not in CORES, reason="core 0 is not available here")
def test_bind_core_list_pins_the_rank_to_the_listed_core(job, tmp_path):
    done = job.run("--num_procs", "1", "--bind_core_list", "0", str(SCRIPTS / "report_affinity.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert ranks(tmp_path)[0] == {"argv": ["--local_rank=0", str(tmp_path)], "cores": [0], "omp": "1"}


@pytest.fixture
def fake_numactl(tmp_path):
    """A `numactl` first on PATH that pins itself as numactl would; its log holds each call's arguments."""
    folder = tmp_path / "numactl_bin"
    folder.mkdir()
    (folder / "numactl").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                                    f"{shlex.quote(str(SCRIPTS / 'fake_numactl.py'))} \"$@\"\n")
    (folder / "numactl").chmod(0o755)
    log = tmp_path / "numactl.log"
    return {"PATH": f"{folder}:{os.environ['PATH']}", "FAKE_NUMACTL_LOG": str(log)}, log


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to give 2 ranks one each")
def test_bind_cores_goes_through_numactl_where_installed(job, tmp_path, fake_numactl):
    """numactl runs the rank wrapper again, pinned: the wrapper's flags and the script's arguments survive."""
    env, log = fake_numactl
    out = tmp_path / "out"
    out.mkdir()
    done = job.run("--num_procs", "2", "--bind_cores_to_rank", "--no_local_rank", str(SCRIPTS / "report_affinity.py"),
                   "--x", "1", str(out), extra_env=env)
    assert done.returncode == 0, done.stderr
    shares = _expected_shares(CORES, 2)
    calls = sorted(json.loads(line)[0] for line in log.read_text().splitlines())
    assert calls == sorted(f"--physcpubind={share[0]}" + (f"-{share[-1]}" if len(share) > 1 else "") for share in shares)
    for rank, seen in ranks(out).items():
        assert seen == {"argv": ["--x", "1", str(out)], "cores": shares[rank], "omp": str(len(shares[rank]))}


@pytest.mark.parametrize(("flags", "message"), [
    (["--bind_core_list", "0-"], "--bind_core_list '0-': '0-' is not a core number or range; expected comma-separated"),
    (["--bind_core_list", "3-1"], "range '3-1' ends before it starts"),
    (["--bind_core_list", "0,0"], "core 0 is listed twice"),
    (["--bind_core_list", "4096"], "--bind_core_list '4096': core(s) 4096 are not available on this machine"),
    (["--bind_cores_to_rank", "--num_procs", str(len(CORES) + 1)],
     f"for {len(CORES) + 1} rank(s) there; each rank needs at least one core"),
])
def test_bad_core_binding_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    code = main([*flags, str(SCRIPTS / "report_affinity.py"), str(tmp_path)])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("rank*.json"))
