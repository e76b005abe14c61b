"""Every launcher's command line, built from the command line as a user types it: pure, no process started.

The MPI and SLURM lines are laid out as DeepSpeed's runners lay them out (deepspeed/launcher/
multinode_runner.py), with the launchers' own documented flags: OpenMPI's `mpirun -n -hostfile --mca -x`,
Hydra's (MPICH, Intel MPI, MVAPICH) `-n/-np -ppn -genv/-env NAME VALUE -hosts/--hostfile`, and srun's
`-n --nodelist --nodes --gpus-per-node --cpu-bind=none --export=ALL,NAME=VALUE` (srun(1)).
"""

from __future__ import annotations

import shlex
import sys

import pytest

from dstrain.launcher import LaunchError
from dstrain.launcher.cli import build_parser, joined_launcher_args, main, mpi_job, plan
from dstrain.launcher.commands import RANK_ENTRY, exported_environment, node_argv, remote_shell_env
from dstrain.launcher.mpi import command, exports, hostfile_text

NO_GPUS = {"CUDA_VISIBLE_DEVICES": ""}
RANKS = [sys.executable, "-u", RANK_ENTRY, "train.py", "--lr", "1"]


@pytest.fixture
def two_hosts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no .deepspeed_env of the machine's user
    (tmp_path / "hosts").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    return tmp_path


def mpi(*argv: str, environ: dict[str, str] | None = None, script: tuple[str, ...] = ("train.py", "--lr", "1")):
    parser = build_parser()
    args = parser.parse_args(joined_launcher_args(parser, [*argv, *script]))
    job, _ = plan(args, environ or NO_GPUS)
    return mpi_job(args, job, environ or NO_GPUS)


def words(argv: list[str], flag: str) -> list[str]:
    """The values following each `flag` in argv (one word each)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_openmpi_runs_mpirun_over_a_hostfile_of_the_chosen_hosts(two_hosts):
    mj = mpi("--hostfile", "hosts", "--launcher", "openmpi", "--launcher_args", "--allow-run-as-root -mca foo 1")
    assert hostfile_text(mj) == "worker-0 slots=2\nworker-1 slots=2\n"
    argv = command(mj, "/private/hostfile")
    assert argv[:11] == ["mpirun", "-n", "4", "-hostfile", "/private/hostfile", "--mca", "btl", "^openib",
                         "--mca", "btl_tcp_if_include", "eth0"]  # DeepSpeed's defaults
    assert argv[11:15] == ["--allow-run-as-root", "-mca", "foo", "1"]  # --launcher_args, where DeepSpeed puts them
    assert words(argv, "-x") == ["UCX_TLS=tcp", "MASTER_ADDR=worker-0", "MASTER_PORT=29500",
                                 "CUDA_VISIBLE_DEVICES=0,1"]
    assert argv[-6:] == RANKS


def test_openmpi_keeps_a_tcp_interface_given_in_launcher_args(two_hosts):
    argv = command(mpi("-H", "hosts", "--launcher", "openmpi", "--launcher_args", "--mca btl_tcp_if_include ib0"), "h")
    assert "eth0" not in argv and argv.count("btl_tcp_if_include") == 1


def test_hostfile_filters_and_counts_choose_the_hosts_of_every_mpi_launcher(two_hosts):
    assert hostfile_text(mpi("-H", "hosts", "--launcher", "openmpi", "--include", "worker-1")) == "worker-1 slots=2\n"
    assert hostfile_text(mpi("-H", "hosts", "--launcher", "openmpi", "--num_nodes", "1")) == "worker-0 slots=2\n"
    assert hostfile_text(mpi("-H", "hosts", "--launcher", "openmpi", "--num_gpus", "1")) == \
        "worker-0 slots=1\nworker-1 slots=1\n"
    uneven = mpi("-H", "hosts", "--launcher", "openmpi", "--exclude", "worker-0:1")
    assert hostfile_text(uneven) == "worker-0 slots=1\nworker-1 slots=2\n"
    assert "CUDA_VISIBLE_DEVICES" not in exports(uneven)  # each host's first N devices: local rank N picks its own
    same_slot = mpi("-H", "hosts", "--launcher", "openmpi", "--include", "worker-0:1@worker-1:1")
    assert exports(same_slot)["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(LaunchError, match=r"every host must use the same device ids.*worker-0: \[0\], worker-1: \[1\]"):
        mpi("-H", "hosts", "--launcher", "openmpi", "--include", "worker-0:0@worker-1:1")


def test_mpich_runs_hydra_with_two_word_genv_and_the_rendezvous(two_hosts):
    argv = command(mpi("-H", "hosts", "--launcher", "mpich", "--launcher_args", "-bind-to none"))
    assert argv[:7] == ["mpirun", "-n", "4", "-ppn", "2", "-bind-to", "none"]
    genv = [argv[i + 1:i + 3] for i, a in enumerate(argv) if a == "-genv"]
    assert genv == [["MASTER_ADDR", "worker-0"], ["MASTER_PORT", "29500"], ["CUDA_VISIBLE_DEVICES", "0,1"],
                    ["WORLD_SIZE", "4"], ["LOCAL_SIZE", "2"]]
    assert words(argv, "-hosts") == ["worker-0,worker-1"] and argv[-6:] == RANKS


def test_intel_mpi_turns_its_pinning_off_and_runs_one_program(two_hosts):
    argv = command(mpi("-H", "hosts", "--launcher", "impi"))
    assert argv[:3] == ["mpirun", "-ppn", "2"]
    genv = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-genv"}
    assert genv["I_MPI_PIN"] == "0" and genv["WORLD_SIZE"] == "4" and genv["MASTER_ADDR"] == "worker-0"
    assert argv[-9:-6] == ["worker-0,worker-1", "-n", "4"] and argv[-6:] == RANKS


def test_mvapich_runs_hydra_over_a_host_list_with_deepspeeds_settings(two_hosts):
    mj = mpi("-H", "hosts", "--launcher", "mvapich")
    assert hostfile_text(mj) == "worker-0\nworker-1\n"
    argv = command(mj, "/private/hostfile")
    assert argv[:7] == ["mpirun", "-np", "4", "-ppn", "2", "--hostfile", "/private/hostfile"]
    env = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-env"}
    assert env["MV2_SMP_USE_CMA"] == "0" and env["MV2_ENABLE_AFFINITY"] == "0" and "MV2_USE_CUDA" not in env
    assert env["MASTER_ADDR"] == "worker-0" and argv[-6:] == RANKS
    assert exports(mpi("-H", "hosts", "--launcher", "mvapich", environ={"CUDA_VISIBLE_DEVICES": "0,1"}))[
        "MV2_USE_CUDA"] == "1"


@pytest.mark.parametrize("flavour", ["mpich", "impi", "mvapich", "slurm"])
def test_launchers_with_one_count_per_host_refuse_uneven_hosts(two_hosts, flavour):
    with pytest.raises(LaunchError, match=r"same number of processes on every host.*worker-0: 1, worker-1: 2"):
        mpi("-H", "hosts", "--launcher", flavour, "--exclude", "worker-0:1")


def test_slurm_runs_srun_with_deepspeeds_placement_flags(two_hosts):
    argv = command(mpi("-H", "hosts", "--launcher", "slurm", "--launcher_args", "--partition=debug -t 5"))
    assert argv[:5] == ["srun", "-n", "4", "--partition=debug", "-t"]
    # No MASTER_ADDR: rank 0 runs on SLURM's first node of the step, which the ranks read from SLURM_STEP_NODELIST.
    assert argv[-7:] == ["--export=ALL,MASTER_PORT=29500", *RANKS]
    assert command(mpi("-H", "hosts", "--launcher", "slurm", "--include", "worker-1"))[3:7] == \
        ["--nodelist", "worker-1", "--nodes", "1"]  # --nodelist alone is only an upper bound
    assert command(mpi("-H", "hosts", "--launcher", "slurm", "--num_nodes", "1"))[:5] == \
        ["srun", "-n", "2", "--nodes", "1"]
    assert command(mpi("-H", "hosts", "--launcher", "slurm", "--num_gpus", "1"))[:5] == \
        ["srun", "-n", "2", "--gpus-per-node", "1"]  # --num_gpus is per node
    assert "--gpus-per-node" not in command(mpi("-H", "hosts", "--launcher", "slurm", "--num_procs", "1"))
    given = command(mpi("-H", "hosts", "--launcher", "slurm", "--master_addr", "10.0.0.7"))
    assert "--export=ALL,MASTER_ADDR=10.0.0.7,MASTER_PORT=29500" in given
    with pytest.raises(LaunchError, match="srun places tasks by count and cannot choose device ids"):
        mpi("-H", "hosts", "--launcher", "slurm", "--include", "worker-0:1@worker-1:1")


def test_slurm_refuses_a_value_its_export_list_would_split(two_hosts):
    (two_hosts / ".deepspeed_env").write_text("NCCL_SOCKET_IFNAME=eth0,eth1\n")
    with pytest.raises(LaunchError, match=r"NCCL_SOCKET_IFNAME='eth0,eth1' holds a comma"):
        command(mpi("-H", "hosts", "--launcher", "slurm"))
    assert "-x" in command(mpi("-H", "hosts", "--launcher", "openmpi"), "h")  # one -x per variable: no limit


@pytest.mark.parametrize("flavour", ["openmpi", "mpich", "impi", "mvapich", "slurm"])
def test_exported_values_reach_the_ranks_as_one_word_each(two_hosts, flavour):
    value = "a b \"q\" 'q' $(x) `y`"  # no shell sees it: no quoting to do, none to undo
    (two_hosts / ".deepspeed_env").write_text(f"MY_VAR={value}\n")
    argv = command(mpi("-H", "hosts", "--launcher", flavour), "h")
    assert (f"MY_VAR={value}" in argv or value in argv or any(f",MY_VAR={value}," in a for a in argv))


@pytest.mark.parametrize("flavour", ["openmpi", "mpich", "impi", "mvapich", "slurm"])
def test_a_script_argument_that_would_start_a_second_program_is_refused(two_hosts, flavour):
    with pytest.raises(LaunchError, match=r"script argument 2 is ':'.*second program"):
        mpi("-H", "hosts", "--launcher", flavour, script=("train.py", "--sep", ":"))
    mpi("-H", "hosts", "--launcher", flavour, script=("train.py", "--sep=:"))


def test_core_binding_is_left_to_the_rank_wrapper(two_hosts):
    argv = command(mpi("--num_procs", "2", "--launcher", "openmpi", "--bind_cores_to_rank"), "h")
    assert "--bind-to" in argv and argv[argv.index("--bind-to") + 1] == "none"
    assert argv[-5:-3] == ["--bind_cores", "all"]
    assert "--cpu-bind=none" in command(mpi("--num_procs", "2", "--launcher", "slurm", "--bind_cores_to_rank"))
    assert "--bind-to" not in command(mpi("--num_procs", "2", "--launcher", "openmpi"), "h")


def test_one_machine_without_a_hostfile(two_hosts):
    mj = mpi("--num_procs", "3", "--launcher", "OpenMPI")  # DeepSpeed reads the name in any case
    assert hostfile_text(mj) == "localhost slots=3\n"
    assert words(command(mj, "h"), "-x")[1:] == ["MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"]  # the user's devices
    assert command(mpi("--num_procs", "3", "--launcher", "slurm"))[:3] == ["srun", "-n", "3"]


@pytest.mark.parametrize(("argv", "message"), [
    (("--launcher", "openmpi", "--ssh_port", "2222"), "--ssh_port is for the ssh / pdsh launchers"),
    (("--launcher", "slurm", "--no_ssh", "--node_rank", "0"), "--no_ssh is for the ssh / pdsh launchers"),
    (("--launcher", "openmpi", "--launcher_args", "'unclosed"), "--launcher_args \"'unclosed\": No closing quotation"),
    (("--launcher", "local", "--launcher_args", "-v"), "--launcher local starts no program"),
])
def test_options_the_launcher_cannot_honour_are_refused(two_hosts, argv, message):
    with pytest.raises(LaunchError, match=message):
        mpi("-H", "hosts", *argv)


def test_launcher_args_may_start_with_a_dash_and_stay_the_launchers(two_hosts):
    parser = build_parser()
    args = parser.parse_args(joined_launcher_args(parser, ["--launcher", "openmpi", "--launcher_args",
                                                           "--allow-run-as-root", "train.py", "--launcher_args", "x"]))
    assert args.launcher_args == "--allow-run-as-root" and args.script_args == ["--launcher_args", "x"]


def test_remote_shells_take_launcher_args_and_pdsh_the_ssh_port(two_hosts):
    job, nodes = plan(build_parser().parse_args(["-H", "hosts", "--launcher_args", "-l admin", "train.py"]), NO_GPUS)
    assert node_argv(job, nodes[1], "pdsh")[:8] == ["pdsh", "-S", "-R", "ssh", "-w", "worker-1", "-l", "admin"]
    assert node_argv(job, nodes[1], "ssh", 2222)[:8] == ["ssh", "-o", "BatchMode=yes", "-l", "admin", "-p", "2222",
                                                         "--"]
    env = remote_shell_env("pdsh", 2222, {"PDSH_SSH_ARGS_APPEND": "-q"})
    assert env["PDSH_SSH_ARGS_APPEND"] == "-q -p 2222"  # as DeepSpeed passes --ssh_port to pdsh
    assert remote_shell_env("ssh", 2222) is None and remote_shell_env("pdsh", None) is None


def test_ds_env_file_names_another_env_file(tmp_path):
    (tmp_path / "cluster.env").write_text("NCCL_IB_HCA=mlx5\n")
    env = exported_environment({"DS_ENV_FILE": "cluster.env", "MLFLOW_TRACKING_URI": "file:/m"},
                               home=str(tmp_path / "none"), cwd=str(tmp_path))
    assert env == {"MLFLOW_TRACKING_URI": "file:/m", "NCCL_IB_HCA": "mlx5"}  # MLFLOW*: DeepSpeed exports it too


def test_dry_run_prints_the_hostfile_and_the_command(two_hosts, capsys):
    assert main(["-H", "hosts", "--launcher", "openmpi", "--dry_run", "train.py", "--lr", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == ["#   worker-0 slots=2", "#   worker-1 slots=2"]
    assert out[3].startswith("# run by the node agent")
    assert shlex.split(out[4])[:5] == ["mpirun", "-n", "4", "-hostfile", "<hostfile>"]


def test_a_missing_mpi_is_named_with_its_install_line(two_hosts, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(two_hosts))  # nothing on it
    assert main(["-H", "hosts", "--launcher", "mvapich", "train.py"]) == 2
    assert "MVAPICH's 'mpirun' is not on the PATH; install it" in capsys.readouterr().err
