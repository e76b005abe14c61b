"""`dstrain --elastic_training`: each node's torchrun joins one c10d rendezvous; a node that joins or leaves restarts
the ranks at the new size, and the example script resumes from its checkpoint with the batch its config's
`elasticity` section picks for that size. End to end with real torchrun agents on this machine (two launchers, as
two machines would run them), then the command lines and the supervisor's rule for a node that leaves."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_launcher import free_port, job  # noqa: F401  (job: the fixture that fails on orphans)

from dstrain.launcher import LaunchError
from dstrain.launcher.cli import build_parser, plan
from dstrain.launcher.commands import node_argv, node_env
from dstrain.launcher.runner import Launch, Supervisor

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPT = [str(EXAMPLES / "train_gpt_elastic.py"), "--deepspeed_config", str(EXAMPLES / "configs" / "elastic.json"),
          "--out", "ckpt", "--save-every", "1"]


def losses(text: str) -> dict[int, float]:
    """Each step's loss as last printed (a step cut short by a restart is trained again from its checkpoint)."""
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d+) world \d+ loss ([\d.]+)$", text, re.M)}


def latest(folder: Path) -> tuple[int, int]:
    """(step, ranks) of the newest checkpoint in folder/ckpt: its ZeRO shards count the ranks that wrote it."""
    tag = (folder / "ckpt" / "latest").read_text().strip() if (folder / "ckpt" / "latest").is_file() else ""
    shards = sorted((folder / "ckpt" / tag / "zero").glob("zero_shard_*-of-*.safetensors")) if tag else []
    ranks = int(shards[0].name.split("-of-")[1].split(".")[0]) if shards else 0
    return int(tag.removeprefix("global_step") or 0), ranks


def wait_for(folder: Path, launcher: subprocess.Popen, what: str, done, timeout: float = 180) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while not done(*latest(folder)):
        assert launcher.poll() is None, f"the launcher ended before {what}: {launcher.communicate()}"
        assert time.monotonic() < deadline, f"no checkpoint {what} within {timeout} s (newest: {latest(folder)})"
        time.sleep(0.1)
    return latest(folder)


def test_a_node_joins_then_leaves_and_training_follows_the_same_losses(job, tmp_path):  # noqa: F811
    # Phases are read from the checkpoints (step, ranks that wrote it), so a slow join on a loaded machine only
    # moves them later; 60 steps of >= 0.5 s leave the join half a minute.
    steps = ["--steps", "60"]
    elastic = ["--elastic_training", "--min_elastic_nodes", "1", "--max_elastic_nodes", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), "--rdzv_conf", "last_call_timeout=1",
               "--num_procs", "1", *SCRIPT, *steps, "--pause", "0.5"]
    first = job.start(*elastic, port=False)
    wait_for(tmp_path, first, "of step 3", lambda step, ranks: step >= 3)
    second = job.start(*elastic, port=False)  # another machine running the same command
    joined, _ = wait_for(tmp_path, first, "written by two ranks", lambda step, ranks: ranks == 2)
    wait_for(tmp_path, first, f"of step {joined + 3}", lambda step, ranks: step >= joined + 3)
    second.send_signal(signal.SIGTERM)  # that machine leaves: its launcher stops its node
    out, err = first.communicate(timeout=240)
    _, second_err = second.communicate(timeout=60)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode == 128 + signal.SIGTERM, second_err[-3000:]
    sizes = re.findall(r"^world (\d): batch 32 = micro 16 x (\d) x \d; (starting|resumed)", out, re.M)
    assert [(world, gas) for world, gas, _ in sizes] == [("1", "2"), ("2", "1"), ("1", "2")], out
    reference = job.run("--num_procs", "1", *SCRIPT[:-4], "--out", "reference", *steps)  # one rank throughout
    assert reference.returncode == 0, reference.stderr
    want = losses(reference.stdout)
    got = losses(out)
    assert sorted(got) == sorted(want) == list(range(1, 61))
    for step, loss in want.items():  # the same samples and state each step, at either size
        assert abs(got[step] - loss) < 2e-3, (step, got[step], loss)


def _plan(*argv: str, environ: dict[str, str] | None = None):
    return plan(build_parser().parse_args([*argv, "train.py", "--lr", "1"]), environ or {})


def test_each_node_joins_one_c10d_rendezvous_that_restarts_its_ranks():
    job_, nodes = _plan("--elastic_training", "--max_elastic_nodes", "3", "--master_addr", "10.0.0.1",
                        "--rdzv_conf", "last_call_timeout=5,join_timeout=60", "--num_procs", "2")
    argv = node_argv(job_, nodes[0])
    torchrun = argv[argv.index("torch.distributed.run") + 1:]
    assert torchrun[:7] == ["--nnodes=1:3", "--nproc_per_node=2", "--rdzv_backend=c10d",
                            "--rdzv_endpoint=10.0.0.1:29500", "--rdzv_id=dstrain-elastic",
                            "--rdzv_conf=last_call_timeout=5,join_timeout=60", "--max_restarts=100"]
    assert not [a for a in argv if a.startswith(("--node_rank", "--standalone", "--master_port"))]
    assert node_env(job_, nodes[0])["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    job_, nodes = _plan("--elastic_training", "--num_procs", "1", environ={"ELASTIC_RUN_ID": "job-7"})
    argv = node_argv(job_, nodes[0])
    assert "--nnodes=1:1" in argv and "--rdzv_id=job-7" in argv and "--rdzv_endpoint=127.0.0.1:29500" in argv
    plain, plain_nodes = _plan("--num_procs", "1")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in node_env(plain, plain_nodes[0])


@pytest.mark.parametrize("argv, message", [
    (["--min_elastic_nodes", "2"], "--min_elastic_nodes: only with --elastic_training"),
    (["--elastic_training", "--min_elastic_nodes", "3", "--max_elastic_nodes", "2"], "need 1 <= min <= max"),
    (["--elastic_training", "--min_elastic_nodes", "0"], "need 1 <= min <= max"),
    (["--elastic_training", "--rdzv_conf", "last_cal_timeout=1"], "'last_cal_timeout=1' is not KEY=VALUE"),
    (["--elastic_training", "--rdzv_conf", "timeout=1;reboot"], "is not KEY=VALUE"),
    (["--elastic_training", "--launcher", "openmpi"], "cannot change their number"),
    (["--elastic_training", "--no_ssh", "--node_rank", "0"], "needs --master_addr"),
])
def test_elastic_options_that_cannot_work_are_refused(argv, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        _plan(*argv, "--num_procs", "1")


def test_a_rendezvous_id_that_would_reach_a_shell_unquoted_is_refused():
    with pytest.raises(LaunchError, match="ELASTIC_RUN_ID"):
        _plan("--elastic_training", "--num_procs", "1", environ={"ELASTIC_RUN_ID": "a b; rm"})


def _launch(name: str, code: str) -> Launch:
    return Launch(name, f"[{name}] ", (sys.executable, "-c", code))


@pytest.mark.parametrize("elastic_min, expected", [(1, 0), (2, 3), (None, 3)], ids=["goes-on", "too-few", "plain"])
def test_a_node_that_fails_is_let_go_while_enough_nodes_run(elastic_min, expected, tmp_path, capfd):
    launches = [_launch("node 0", "import time; time.sleep(2)"), _launch("node 1", "raise SystemExit(3)")]
    started = time.monotonic()
    assert Supervisor(launches, str(tmp_path), grace=2.0, elastic_min_nodes=elastic_min).run() == expected
    said = capfd.readouterr().err
    if expected == 0:  # node 0 ran to its end
        assert "node 1 exited with code 3; elastic training goes on with the 1 running node(s)" in said
        assert time.monotonic() - started >= 1.9
    else:
        assert "node 1 exited with code 3; stopping the other nodes" in said
    every_failed = [_launch("node 0", "import time; time.sleep(0.5); raise SystemExit(4)"),
                    _launch("node 1", "raise SystemExit(3)")]
    assert Supervisor(every_failed, str(tmp_path), grace=2.0, elastic_min_nodes=1).run() == 4
