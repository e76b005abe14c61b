"""`dstrain --launcher slurm` for real: srun on a private one-node SLURM cluster (slurm_cluster.py), each task
reading its place from SLURM_PROCID / SLURM_LOCALID / SLURM_STEP_*; a launcher killed outright leaves nothing."""

from __future__ import annotations

import os

import pytest
import slurm_cluster
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

pytestmark = pytest.mark.skipif(slurm_cluster.missing() is not None, reason=str(slurm_cluster.missing()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        running.start()
        print(f"SLURM cluster up in {running.started_in:.1f} s")
        yield running
    finally:
        running.stop()


@pytest.fixture
def job(tmp_path, cluster):
    launches = Launches(tmp_path)
    launches.env["SLURM_CONF"] = str(cluster.conf)
    yield launches
    for proc in launches.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = orphans(launches.tag, settle=15)
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"processes left behind: {left}"


def test_two_tasks_all_reduce_through_srun(job, tmp_path):
    done = job.run("--launcher", "slurm", "--num_procs", "2", str(SCRIPTS / "allreduce.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = ranks(tmp_path)
    assert sorted(seen) == [0, 1]
    for rank, r in seen.items():
        assert (r["rank"], r["world"], r["sum"]) == (rank, 2, 3.0)  # a real gloo all-reduce
        assert r["argv"][0] == f"--local_rank={rank}"
        assert r["env"]["MASTER_ADDR"] == "127.0.0.1"  # one node: loopback


def test_four_tasks_read_their_place_from_slurm(job, tmp_path):
    # Four tasks on this machine's cores: srun's --overcommit, given through --launcher_args.
    port = str(free_port())
    done = job.run("--launcher", "slurm", "--launcher_args", "--overcommit", "--num_procs", "4", "--master_port", port,
                   str(SCRIPTS / "report_environ.py"), str(tmp_path), port=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = ranks(tmp_path)
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, r in seen.items():
        env = r["environ"]
        assert env["SLURM_PROCID"] == env["RANK"] == str(rank)
        assert env["SLURM_LOCALID"] == env["LOCAL_RANK"] == str(rank)
        assert env["SLURM_STEP_NUM_TASKS"] == env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
        assert env["MASTER_PORT"] == port  # exported with --export=ALL,MASTER_PORT=...


def test_killed_launcher_leaves_nothing(job, tmp_path):
    """SIGKILL to the launcher: its node agent stops srun, and SLURM ends the step with every task and helper."""
    proc = job.start("--launcher", "slurm", "--num_procs", "2", "--stop_grace", "3", str(SCRIPTS / "hang.py"),
                     str(tmp_path))
    wait_for_files(tmp_path, ["started.0", "started.1"], proc)
    assert len(tagged_processes(job.tag)) >= 6  # launcher, agent, keeper, srun, 2 tasks (+ helpers)
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    assert not orphans(job.tag, settle=20)
