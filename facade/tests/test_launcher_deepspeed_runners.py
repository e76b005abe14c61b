"""DeepSpeed's launcher helpers (`deepspeed.launcher.runner`'s parsers, `deepspeed.launcher.multinode_runner`'s
runner classes, `deepspeed.utils.numa.parse_range_list`) on dstrain's launcher: the same parsing, checks and
command lines as the `dstrain` command. Pure functions and command lines: no process is started."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from dstrain.compat.launcher import multinode_runner as mn
from dstrain.compat.launcher import runner
from dstrain.compat.utils.numa import parse_range_list
from dstrain.launcher import mpi
from dstrain.launcher.cli import build_parser, mpi_job, plan
from dstrain.launcher.errors import FilterError, HostfileError, LaunchError

POOL = {"worker-0": 4, "worker-1": 4}


def test_hostfile_lines_and_every_bad_one():
    lines = ["", "  worker-1 slots=2", "123.23.12.10 slots=2", "# worker-1 slots=3", "localhost slots=1  # this"]
    assert runner._parse_hostfile(lines) == {"worker-1": 2, "123.23.12.10": 2, "localhost": 1}
    for bad in (["a slots=2", "b slots=1", "a slots=1"], ["this is bad slots=1"], ["missingslots"], ["  "], []):
        with pytest.raises(HostfileError):  # a ValueError, as DeepSpeed's parser raises
            runner._parse_hostfile(bad)


def test_resource_filter_on_slot_lists():
    hosts = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}
    assert runner.parse_resource_filter(hosts) == hosts
    assert runner.parse_resource_filter(hosts, include_str="worker-0:1@worker-0:0,1") == {"worker-0": [0, 1]}
    assert runner.parse_resource_filter(hosts, exclude_str="worker-0:0,1@worker-1:3") == {"worker-0": [2, 3],
                                                                                         "worker-1": [0, 1, 2]}
    assert runner.parse_resource_filter({"worker-0": [0, 1]}, exclude_str="worker-0") == {}
    for kwargs in ({"include_str": "A", "exclude_str": "B"}, {"include_str": "jeff"}, {"exclude_str": "worker-1:4"},
                   {"exclude_str": "worker-1@worker-0:1@5"}):
        with pytest.raises(ValueError):
            runner.parse_resource_filter(hosts, **kwargs)


@pytest.mark.parametrize("argv", ["--num_nodes 1 -i localhost foo.py", "--num_gpus 1 -e localhost foo.py"])
def test_main_raises_for_a_filter_with_a_count(argv):
    with pytest.raises(FilterError):
        runner.main(args=argv.split())


def test_parse_args_names_the_script_as_deepspeed_does():
    args = runner.parse_args(["--launcher_arg", "-mca btl_tcp_if_include eth1", "train.py", "--prompt", "a b"])
    assert (args.user_script, args.user_args) == ("train.py", ["--prompt", "a b"])
    assert args.launcher_args == "-mca btl_tcp_if_include eth1"
    world = {"worker-0": [0, 1], "worker-1": [3]}
    assert json.loads(base64.urlsafe_b64decode(runner.encode_world_info(world))) == world


def _cli_command(flavour: str, tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "hosts").write_text("".join(f"{h} slots={n}\n" for h, n in POOL.items()))
    args = build_parser().parse_args(["--launcher", flavour, "--hostfile", str(tmp_path / "hosts"), *extra,
                                      "train.py", "--lr", "1"])
    job, _ = plan(args, {})
    return mpi.command(mpi_job(args, job, {}), "<hostfile>")


@pytest.mark.parametrize("cls, flavour", [(mn.OpenMPIRunner, "openmpi"), (mn.MPICHRunner, "mpich"),
                                          (mn.IMPIRunner, "impi"), (mn.MVAPICHRunner, "mvapich"),
                                          (mn.SlurmRunner, "slurm")])
def test_mpi_runners_give_the_command_dstrain_runs(cls, flavour, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = runner.parse_args(["train.py", "--lr", "1"])
    mpi_runner = cls(args, runner.encode_world_info(POOL), POOL)
    assert mpi_runner.name == flavour
    cmd = mpi_runner.get_cmd({}, POOL)
    hostfile = mpi_runner._folder and str(Path(mpi_runner._folder) / "hostfile")
    assert [("<hostfile>" if word == hostfile else word) for word in cmd] == _cli_command(flavour, tmp_path)
    if hostfile:  # OpenMPI and MVAPICH read the hosts from a file only this user can read
        assert stat.S_IMODE(Path(hostfile).stat().st_mode) == 0o600
        assert "worker-1" in Path(hostfile).read_text()
    assert cmd[0] == mpi.PROGRAM[flavour]


def test_openmpi_interface_default_gives_way_to_the_launcher_args(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    world = runner.encode_world_info(POOL)
    assert "eth0" in mn.OpenMPIRunner(runner.parse_args(["t.py"]), world, POOL).get_cmd({}, POOL)
    for option in ("-mca", "--mca"):
        args = runner.parse_args(["--launcher_arg", f"{option} btl_tcp_if_include eth1", "t.py"])
        cmd = mn.OpenMPIRunner(args, world, POOL).get_cmd({}, POOL)
        assert "eth0" not in cmd and "eth1" in cmd


def test_exports_reach_every_rank_as_given_and_names_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mpi_runner = mn.MPICHRunner(runner.parse_args(["t.py"]), runner.encode_world_info(POOL), POOL)
    mpi_runner.add_export(" SLURM_JOB_CPUS_PER_NODE ", " 64(x2) ")
    mpi_runner.add_export("PYTHONPATH", "/usr/lib/python3/site-packages")
    assert mpi_runner.exports == {"SLURM_JOB_CPUS_PER_NODE": "64(x2)", "PYTHONPATH": "/usr/lib/python3/site-packages"}
    cmd = mpi_runner.get_cmd({}, POOL)
    at = cmd.index("SLURM_JOB_CPUS_PER_NODE")
    assert cmd[at - 1:at + 2] == ["-genv", "SLURM_JOB_CPUS_PER_NODE", "64(x2)"]  # an argv word: no quotes needed
    with pytest.raises(LaunchError, match="is not a variable name"):
        mpi_runner.add_export("A;rm -rf", "1")


def test_pdsh_runner_starts_one_node(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = runner.parse_args(["--ssh_port", "2222", "t.py", "a b"])
    pdsh = mn.PDSHRunner(args, runner.encode_world_info({"worker-1": 2}))
    cmd, kill, env = pdsh.get_cmd({"PATH": "/bin"}, {"worker-1": [0, 1]})
    assert cmd[:6] == ["pdsh", "-S", "-R", "ssh", "-w", "worker-1"] and kill is None
    assert "'a b'" in cmd[-1] and "CUDA_VISIBLE_DEVICES=0,1" in cmd[-1]
    assert env["PDSH_RCMD_TYPE"] == "ssh" and env["PDSH_SSH_ARGS_APPEND"] == "-p 2222" and env["PATH"] == "/bin"
    with pytest.raises(LaunchError, match="one pdsh per node"):
        pdsh.get_cmd({}, POOL)


def test_a_runner_of_ones_own():
    class Dummy(mn.MultiNodeRunner):
        def backend_exists(self):
            return True

        def get_cmd(self, environment, active_resources):
            return []

    args = runner.parse_args(["t.py", "--x", "1"])
    dummy = Dummy(args, runner.encode_world_info({"h": [0]}))
    assert (dummy.user_script, dummy.user_arguments, dummy.world_info(), dummy.name) == ("t.py", ["--x", "1"],
                                                                                        {"h": [0]}, "Dummy")
    with pytest.raises(TypeError):
        mn.MultiNodeRunner(args, "")  # abstract


def test_parse_range_list_ascending_without_repeats():
    assert parse_range_list("0,2-4,6,8-9") == [0, 2, 3, 4, 6, 8, 9]
    for bad, why in (("0,2-6,5-9", "listed twice"), ("8,2-6", "ascending"), ("1,6-2", "ends before it starts"),
                     ("1,,2", "not a core number")):
        with pytest.raises(ValueError, match=why):
            parse_range_list(bad)
