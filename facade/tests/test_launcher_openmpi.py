"""`dstrain --launcher openmpi` for real: OpenMPI's mpirun on this machine (Debian's openmpi-bin), 2 and 4 ranks,
each reading its place from OMPI_COMM_WORLD_*; a launcher killed outright leaves nothing behind; and a bare
`mpirun -np 2` trains the example GPT to the same losses as the local launcher."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_launcher import (
    SCRIPTS,
    TIMEOUT,
    Launches,
    free_port,
    orphans,
    ranks,
    tagged_processes,
    wait_for_files,
)

pytestmark = pytest.mark.skipif(shutil.which("ompi_info") is None,
                                reason="OpenMPI is not installed (Debian: apt-get install openmpi-bin; .ci/run does)")
AS_ROOT = ("--launcher_args", "--allow-run-as-root") if os.geteuid() == 0 else ()  # OpenMPI refuses root otherwise
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def job(tmp_path):
    launches = Launches(tmp_path)
    yield launches
    for proc in launches.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = orphans(launches.tag)
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"processes left behind: {left}"


def test_two_ranks_all_reduce_through_mpirun(job, tmp_path):
    done = job.run("--launcher", "openmpi", *AS_ROOT, "--num_procs", "2", str(SCRIPTS / "allreduce.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = ranks(tmp_path)
    assert sorted(seen) == [0, 1]
    for rank, r in seen.items():
        assert (r["rank"], r["world"], r["sum"]) == (rank, 2, 3.0)  # a real gloo all-reduce
        assert r["argv"][0] == f"--local_rank={rank}"
        assert r["env"]["MASTER_ADDR"] == "127.0.0.1"


def test_four_ranks_read_their_place_from_openmpi(job, tmp_path):
    (tmp_path / "hosts").write_text("localhost slots=4\n")
    done = job.run("--launcher", "openmpi", *AS_ROOT, "--hostfile", "hosts", str(SCRIPTS / "report_environ.py"),
                   str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = ranks(tmp_path)
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, r in seen.items():
        env = r["environ"]
        assert env["OMPI_COMM_WORLD_RANK"] == env["RANK"] == str(rank)  # started by mpirun, read as torch's
        assert env["OMPI_COMM_WORLD_LOCAL_RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["OMPI_COMM_WORLD_SIZE"] == env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
        assert env["UCX_TLS"] == "tcp" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # exported with -x
        assert r["argv"][0] == f"--local_rank={rank}"


def test_killed_launcher_leaves_nothing(job, tmp_path):
    """SIGKILL to the launcher: its node agent stops mpirun, the ranks and the helpers they started."""
    proc = job.start("--launcher", "openmpi", *AS_ROOT, "--num_procs", "2", "--stop_grace", "3",
                     str(SCRIPTS / "hang.py"), str(tmp_path))
    wait_for_files(tmp_path, ["started.0", "started.1"], proc)
    assert len(tagged_processes(job.tag)) >= 7  # launcher, agent, keeper, mpirun, 2 ranks, 2 helpers
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    assert not orphans(job.tag, settle=15)


def test_failing_rank_fails_the_job(job, tmp_path):
    done = job.run("--launcher", "openmpi", *AS_ROOT, "--num_procs", "2", str(SCRIPTS / "hang.py"), str(tmp_path),
                   extra_env={"DIE_RANK": "1"})
    assert done.returncode != 0


def _train_gpt(cwd: Path, launch: list[str]) -> str:
    args = [str(EXAMPLES / "train_gpt.py"), "--deepspeed_config", str(EXAMPLES / "configs" / "zero2.json"),
            "--corpus-mb", "0.1", "--seq", "32", "--d-model", "32", "--layers", "1", "--heads", "2", "--steps", "3",
            "--out", str(cwd / "runs")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    done = subprocess.run([*launch, *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT * 2, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = re.search(r"first loss (\S+) -> last loss (\S+) .*validation loss (\S+)", done.stdout)
    assert losses, done.stdout[-2000:]
    return losses.groups()


def test_bare_mpirun_trains_the_example_gpt_as_the_launcher_does(tmp_path):
    """`mpirun -np 2 python train_gpt.py`: init_distributed reads OpenMPI's ranks (no mpi4py, no launcher of ours)."""
    (tmp_path / "local").mkdir()
    (tmp_path / "mpirun").mkdir()
    local = _train_gpt(tmp_path / "local", [sys.executable, "-m", "dstrain.launcher", "--num_procs", "2"])
    mpirun = _train_gpt(tmp_path / "mpirun", ["mpirun", *AS_ROOT[1:], "--bind-to", "none", "-np", "2",
                                              "-x", f"MASTER_PORT={free_port()}", sys.executable])
    assert mpirun == local
