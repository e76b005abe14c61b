"""Starting the process group: a world of one with no environment, torchrun's environment, bad input."""

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}


def python(code, env=None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=env or CLEAN_ENV)


def test_plain_python_is_a_world_of_one():
    out = python("import dscomm, torch\n"
                 "dscomm.init_distributed(); dscomm.init_distributed()\n"
                 "t = torch.ones(3); dscomm.all_reduce(t)\n"
                 "print(dscomm.get_rank(), dscomm.get_world_size(), dscomm.get_backend(), int(t.sum()),"
                 " dscomm.groups.get_data_parallel_world_size())\n"
                 "dscomm.destroy(); print(dscomm.is_initialized())")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "gloo", "3", "1", "False"]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_launch_path():
    for _ in range(3):  # another process may take the free port before torchrun binds it: try another
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                              "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                              str(HERE / "torchrun_worker.py")], capture_output=True, text=True, timeout=300,
                             env=CLEAN_ENV)
        if "address already in use" not in out.stderr.lower():
            break
    assert out.returncode == 0, out.stderr[-2000:]
    # Both ranks share stdout, so their lines may interleave: find the reports, not the lines.
    lines = sorted(re.findall(r"rank=\d world=\d local=\d sum=\d+ backend=\w+ env_rank=\d", out.stdout))
    assert lines == ["rank=0 world=2 local=0 sum=3 backend=gloo env_rank=0",
                     "rank=1 world=2 local=1 sum=3 backend=gloo env_rank=1"]


@pytest.mark.parametrize(("env", "call", "message"), [
    ({"RANK": "0"}, "dscomm.init_distributed()", "world_size (or WORLD_SIZE) is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "dscomm.init_distributed()", "MASTER_ADDR and MASTER_PORT not set"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "dscomm.init_distributed()", "RANK='x' is not an integer"),
    ({}, "dscomm.init_distributed(rank=3, world_size=2)", "rank 3 is outside 0..1"),
    ({}, "dscomm.init_distributed(timeout=30)", "timeout must be a datetime.timedelta"),
])
def test_bad_launch_settings_are_named(env, call, message):
    out = python(f"import dscomm\ntry:\n    {call}\nexcept dscomm.CommError as exc:\n    print(exc)",
                 env={**CLEAN_ENV, **env})
    assert message in out.stdout, out.stdout + out.stderr


MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI's mpirun is not installed (Debian: apt-get install openmpi-bin)")
def test_bare_mpirun_ranks_come_from_openmpis_environment():
    """`mpirun -np 2 python script.py`, no launcher of ours: init_distributed reads OMPI_COMM_WORLD_* (no mpi4py).
    The facade's launcher tests run OpenMPI at 2 and 4 ranks."""
    ranks = 2
    as_root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # MASTER_PORT only: two suites at once must not meet on 29500; the address is discovered (one machine).
    out = subprocess.run([MPIRUN, *as_root, "--bind-to", "none", "-np", str(ranks), "-x", f"MASTER_PORT={free_port()}",
                          sys.executable, str(HERE / "torchrun_worker.py")],
                         capture_output=True, text=True, timeout=120, env=CLEAN_ENV, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = sorted(re.findall(r"rank=\d world=\d local=\d sum=\d+ backend=\w+ env_rank=\d", out.stdout))
    total = ranks * (ranks + 1) // 2
    assert lines == [f"rank={r} world={ranks} local={r} sum={total} backend=gloo env_rank={r}" for r in range(ranks)]
