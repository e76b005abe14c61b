"""Hostfiles, --include/--exclude and the per-node command lines: pure functions, no processes."""

from __future__ import annotations

import shlex

import pytest

from dstrain.launcher import (
    FilterError,
    HostfileError,
    LaunchError,
    filter_resources,
    parse_hostfile,
    parse_hostfile_text,
    select_resources,
)
from dstrain.launcher.cli import build_parser, launch, local_gpu_count, main, plan
from dstrain.launcher.commands import exported_environment, node_argv

HOSTS = {"worker-0": 4, "worker-1": 4, "worker-2": 2}


def test_hostfile_comments_blank_lines_and_order():
    text = "# cluster\n\nworker-1 slots=4  # the big one\n  worker-0   slots = 2\n\n"
    assert list(parse_hostfile_text(text).items()) == [("worker-1", 4), ("worker-0", 2)]


@pytest.mark.parametrize("line, problem", [
    ("worker-0", "expected 'HOSTNAME slots=N'"),
    ("worker-0 gpus=4", "expected 'HOSTNAME slots=N'"),
    ("worker-0 slots=4 extra", "expected 'HOSTNAME slots=N'"),
    ("worker-0 slots=four", "slots must be a positive integer, got 'four'"),
    ("worker-0 slots=0", "slots must be a positive integer, got '0'"),
    ("worker-0 slots=-2", "slots must be a positive integer, got '-2'"),
    ("worker-0 slots=1.5", "slots must be a positive integer, got '1.5'"),
])
def test_each_bad_line_is_named(line, problem):
    with pytest.raises(HostfileError) as info:
        parse_hostfile_text(f"ok slots=1\n# comment\n{line}\n", "hosts")
    assert f"hosts:3: {line!r}: {problem}" in str(info.value)


def test_duplicate_host_names_both_lines_and_every_problem_is_listed():
    with pytest.raises(HostfileError) as info:
        parse_hostfile_text("a slots=1\nb slots=x\na slots=2\n", "hosts")
    message = str(info.value)
    assert "hosts:2: 'b slots=x': slots must be a positive integer" in message
    assert "hosts:3: 'a slots=2': host 'a' is listed twice (first on line 1)" in message


def test_empty_or_missing_hostfile(tmp_path):
    with pytest.raises(HostfileError, match="lists no hosts"):
        parse_hostfile_text("# nothing\n\n", "hosts")
    with pytest.raises(HostfileError, match="cannot read hostfile"):
        parse_hostfile(tmp_path / "absent")
    (tmp_path / "hosts").write_text("w slots=3\n")
    assert parse_hostfile(tmp_path / "hosts") == {"w": 3}


def test_no_filter_uses_every_slot():
    assert select_resources(HOSTS) == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}


def test_include_hosts_and_slots_in_hostfile_order():
    got = select_resources(HOSTS, include="worker-2@worker-0:0,2")
    assert list(got.items()) == [("worker-0", [0, 2]), ("worker-2", [0, 1])]


def test_exclude_slots_and_whole_hosts():
    assert select_resources(HOSTS, exclude="worker-1:0,3@worker-2") == {"worker-0": [0, 1, 2, 3],
                                                                      "worker-1": [1, 2]}
    assert select_resources(HOSTS, exclude="worker-2:0,1") == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}


def test_num_nodes_and_num_procs_take_the_first():
    assert select_resources(HOSTS, num_nodes=2, num_procs=1) == {"worker-0": [0], "worker-1": [0]}


@pytest.mark.parametrize("kwargs, message", [
    ({"include": "worker-0", "exclude": "worker-1"}, "cannot be used together"),
    ({"include": "worker-0", "num_nodes": 1}, "cannot be combined"),
    ({"include": "worker-9"}, "host 'worker-9' is not in the hostfile"),
    ({"include": "worker-2:2"}, "worker-2 has slots 0..1, not 2"),
    ({"include": "worker-0:a"}, "slot 'a' of worker-0 is not an integer"),
    ({"include": "worker-0@"}, "empty host entry"),
    ({"exclude": "worker-0@worker-1@worker-2"}, "no slots left"),
    ({"num_nodes": 4}, "the hostfile has 3 host(s)"),
    ({"num_procs": 0}, "must be positive"),
])
def test_filter_errors(kwargs, message):
    with pytest.raises(LaunchError) as info:
        select_resources(HOSTS, **kwargs)
    assert message in str(info.value)


def test_filter_errors_are_value_errors():
    for kwargs in ({"include": "worker-0", "exclude": "worker-1"}, {"exclude": "worker-0", "num_procs": 1},
                   {"include": "worker-9"}, {"exclude": "worker-2:5"}, {"include": "worker-0:x"}):
        with pytest.raises(FilterError) as info:
            select_resources(HOSTS, **kwargs)
        assert isinstance(info.value, ValueError) and isinstance(info.value, LaunchError)


def test_filter_resources_takes_slot_ids_and_may_leave_nothing():
    pool = {"worker-0": [0, 2, 5], "worker-1": [1, 3]}
    assert filter_resources(pool) == pool and filter_resources(pool) is not pool
    assert filter_resources(pool, include="worker-1@worker-0:5,2@worker-0:0") == {"worker-0": [0, 2, 5],
                                                                                 "worker-1": [1, 3]}
    assert list(filter_resources(pool, include="worker-1@worker-0:5")) == ["worker-0", "worker-1"]  # pool order
    assert filter_resources(pool, exclude="worker-0:2@worker-1") == {"worker-0": [0, 5]}
    assert filter_resources(pool, exclude="worker-0@worker-1:1,3") == {}  # no error: the caller decides
    with pytest.raises(FilterError, match=r"worker-0 has slots 0, 2, 5, not 1"):
        filter_resources(pool, include="worker-0:1")
    with pytest.raises(FilterError, match=r"worker-1 has slots 0\.\.1, not 2"):
        filter_resources({"worker-1": [0, 1]}, exclude="worker-1:2")


@pytest.mark.parametrize("argv", [["--num_nodes", "1", "-i", "localhost"], ["--num_gpus", "1", "-e", "localhost"],
                                  ["--num_procs", "2", "--include", "localhost:0"]])
def test_a_filter_with_a_count_is_refused_without_a_hostfile_too(argv, capsys):
    with pytest.raises(FilterError, match="cannot be combined with --num_nodes/--num_gpus/--num_procs"):
        launch([*argv, "train.py"])  # nothing starts: the refusal comes before any process
    assert main([*argv, "train.py"]) == 2
    assert "dstrain: error: --include/--exclude cannot be combined" in capsys.readouterr().err


def _plan(*argv: str, environ: dict[str, str] | None = None):
    return plan(build_parser().parse_args([*argv, "train.py", "--lr", "1"]), environ or {})


def test_single_machine_defaults_without_gpus():
    job, nodes = _plan("--num_procs", "3", environ={"CUDA_VISIBLE_DEVICES": ""})
    assert [(n.host, n.slots, n.local) for n in nodes] == [("localhost", (0, 1, 2), True)]
    assert job.master_addr == "127.0.0.1" and job.master_port is None  # a free port, below
    assert not job.set_visible_devices  # the user's own CUDA_VISIBLE_DEVICES is kept
    assert local_gpu_count({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert local_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_one_machine_rendezvous_on_a_free_port_unless_a_port_is_given(tmp_path, monkeypatch):
    job, nodes = _plan("--num_procs", "2")
    argv = node_argv(job, nodes[0])
    assert "--standalone" in argv and "--local_addr=127.0.0.1" in argv  # torchrun's store on a free port
    assert not [a for a in argv if a.startswith("--master_port")]
    job, nodes = _plan("--num_procs", "2", "--master_port", "29611")
    argv = node_argv(job, nodes[0])
    assert "--master_port=29611" in argv and "--standalone" not in argv
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    job, nodes = _plan("--hostfile", "hosts")  # every machine must know the port in advance: DeepSpeed's default
    assert job.master_port == 29500 and all("--master_port=29500" in node_argv(job, n) for n in nodes)


def test_core_binding_reaches_each_rank_wrapper(tmp_path, monkeypatch):
    job, nodes = _plan("--num_procs", "1")
    assert "--bind_cores" not in node_argv(job, nodes[0])
    job, nodes = _plan("--num_procs", "1", "--bind_cores_to_rank")
    assert node_argv(job, nodes[0])[-5:] == ["--bind_cores", "all", "train.py", "--lr", "1"]
    job, nodes = _plan("--num_procs", "1", "--bind_core_list", " 0 ")  # implies --bind_cores_to_rank
    assert node_argv(job, nodes[0])[-5:] == ["--bind_cores", "0", "train.py", "--lr", "1"]  # checked, normalised
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("worker-0 slots=4\n")  # remote: only the list's length is known here
    with pytest.raises(LaunchError, match=r"--bind_core_list '0-2' has 3 core\(s\) for the 4 processes of worker-0"):
        _plan("--hostfile", "hosts", "--bind_core_list", "0-2")
    job, nodes = _plan("--hostfile", "hosts", "--bind_core_list", "8-11,20-23")
    assert "--bind_cores 8,9,10,11,20,21,22,23 train.py" in node_argv(job, nodes[0])[-1]


def test_remote_nodes_run_torchrun_over_ssh(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    job, nodes = _plan("--hostfile", "hosts", "--include", "worker-0@worker-1:1", "--ssh_port", "2222")
    assert job.master_addr == "worker-0"
    argv = node_argv(job, nodes[1], "ssh", 2222)
    assert argv[:7] == ["ssh", "-o", "BatchMode=yes", "-p", "2222", "--", "worker-1"]  # '--': never an option
    remote = shlex.split(argv[7])
    assert remote[:3] == ["cd", str(tmp_path), "&&"]
    assert "CUDA_VISIBLE_DEVICES=1" in remote
    for flag in ("--nnodes=2", "--node_rank=1", "--nproc_per_node=1", "--master_addr=worker-0",
                 "--master_port=29500"):
        assert flag in remote
    assert remote[-3:] == ["train.py", "--lr", "1"]
    assert node_argv(job, nodes[1], "pdsh")[:6] == ["pdsh", "-S", "-R", "ssh", "-w", "worker-1"]


def test_launcher_local_and_no_ssh(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("node-a slots=1\nnode-b slots=1\n")
    job, nodes = _plan("--hostfile", "hosts", "--launcher", "local")
    assert all(n.local for n in nodes) and job.master_addr == "127.0.0.1"
    job, nodes = _plan("--hostfile", "hosts", "--no_ssh", "--node_rank", "1", "--master_addr", "10.0.0.1")
    assert [(n.rank, n.host, n.local) for n in nodes] == [(1, "node-b", True)] and len(job.nodes) == 2
    with pytest.raises(LaunchError, match="--no_ssh needs --node_rank"):
        _plan("--hostfile", "hosts", "--no_ssh")
    with pytest.raises(LaunchError, match="only for --no_ssh"):
        _plan("--hostfile", "hosts", "--node_rank", "0")


def test_env_files_reach_every_node(tmp_path):
    (tmp_path / ".deepspeed_env").write_text("# comment\nNCCL_IB_DISABLE=1\nMY_VAR=a b\n")
    env = exported_environment({"NCCL_DEBUG": "INFO", "HOME": "/x", "PYTHONPATH": "/p"}, home=str(tmp_path / "no"),
                               cwd=str(tmp_path))
    assert env == {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/p", "NCCL_IB_DISABLE": "1", "MY_VAR": "a b"}


def test_dry_run_prints_each_node(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    assert main(["--hostfile", "hosts", "--dry_run", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "# node 0 (localhost, slots 0)" in out and "# node 1 (127.0.0.1, slots 0)" in out
    assert "--node_rank=1" in out and "ssh" not in out


@pytest.mark.parametrize("host", ["-Fconfig", "-oProxyCommand", "--", "-", "host;rm", "a$(b)", "[::1]", "user@host",
                                  "host:22", ".leading", "trailing-", "a..b", "x" * 64, "a/b", "fe80::1%$(x)",
                                  "::1::2", "wörker"])
def test_hosts_that_are_not_host_names_or_addresses_are_refused(host):
    with pytest.raises(HostfileError) as info:
        parse_hostfile_text(f"ok slots=1\n{host} slots=2\n", "hosts")
    message = str(info.value)
    assert f"hosts:2: '{host} slots=2': {host!r} is not a host name" in message
    assert "IPv4" in message and "IPv6" in message  # says what is valid


@pytest.mark.parametrize("host", ["worker-0", "node_1", "gpu.cluster.example.com", "10.0.0.1", "::1",
                                  "fe80::1%eth0", "2001:db8::8a2e:370:7334", "a" * 63, "0worker", "host.example."])
def test_host_names_and_addresses_are_accepted(host):
    assert parse_hostfile_text(f"{host} slots=2\n") == {host: 2}


@pytest.mark.parametrize("option", ["--include", "--exclude"])
def test_filters_refuse_what_is_not_a_host_name(option):
    with pytest.raises(LaunchError) as info:
        select_resources(HOSTS, **{option[2:]: "worker-0@-Fconfig:0"})
    assert f"{option} 'worker-0@-Fconfig:0': '-Fconfig' is not a host name" in str(info.value)


def test_master_addr_must_be_a_host_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("worker-0 slots=1\n")
    with pytest.raises(LaunchError, match=r"--master_addr '-oProxyCommand=x': not a host name"):
        _plan("--hostfile", "hosts", "--master_addr=-oProxyCommand=x")
    assert _plan("--hostfile", "hosts", "--master_addr", "10.1.2.3")[0].master_addr == "10.1.2.3"


@pytest.mark.parametrize("line, key", [
    ("X$(touch pwned)=1", "X$(touch pwned)"),
    ("MY VAR=1", "MY VAR"),
    ("=1", ""),
    ("1ST=1", "1ST"),
    ("A-B=1", "A-B"),
    ("export A=1", "export A"),
    ("-u=PATH", "-u"),
])
def test_env_file_keys_must_be_variable_names(tmp_path, line, key):
    (tmp_path / ".deepspeed_env").write_text(f"OK=1\n\n{line}\n")
    with pytest.raises(LaunchError) as info:
        exported_environment({}, home=str(tmp_path / "no"), cwd=str(tmp_path))
    message = str(info.value)
    assert f"{tmp_path / '.deepspeed_env'}:3: {key!r} is not a variable name" in message
    assert "[A-Za-z_][A-Za-z0-9_]*" in message


def test_env_file_line_without_equals_is_an_error(tmp_path):
    (tmp_path / ".dstrain_env").write_text("NCCL_DEBUG\n")
    with pytest.raises(LaunchError, match=r"\.dstrain_env:1: 'NCCL_DEBUG': expected KEY=VALUE"):
        exported_environment({}, home=str(tmp_path / "no"), cwd=str(tmp_path))


def test_exported_variables_with_unusable_names_are_refused():
    with pytest.raises(LaunchError, match=r"environment variable 'NCCL\$\(x\)' cannot be passed to other nodes"):
        exported_environment({"NCCL$(x)": "1"}, home="/nonexistent", cwd="/nonexistent")

