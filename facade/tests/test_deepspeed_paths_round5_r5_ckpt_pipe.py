"""DeepSpeed names its own unit tests use (issue 35, round 5: launcher/test_run.py, test_multinode_runner.py,
test_ds_arguments.py, test_user_args.py), resolved under the alias and used: the runner's hostfile and filter
parsers, `main(args=...)` raising, `parse_args` / `encode_world_info`, the multinode runner classes and
`deepspeed.utils.numa.parse_range_list`. One subprocess: the alias is process-wide."""

from alias_snippet import run_alias_snippet

SNIPPET = r"""
import dstrain.as_deepspeed
import os
from deepspeed.launcher import runner as dsrun
from deepspeed.launcher.multinode_runner import (MPICHRunner, MultiNodeRunner, MVAPICHRunner, OpenMPIRunner,
                                                 PDSHRunner, SlurmRunner)
from deepspeed.launcher.runner import encode_world_info, parse_args
from deepspeed.utils.numa import parse_range_list

hosts = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}
assert dsrun.parse_resource_filter(hosts, exclude_str="worker-1") == {"worker-0": [0, 1, 2, 3]}
assert dsrun.parse_resource_filter(hosts, include_str="worker-1:0,3") == {"worker-1": [0, 3]}
for kwargs in ({"include_str": "A", "exclude_str": "B"}, {"include_str": "worker-1:4"}):
    try:
        dsrun.parse_resource_filter(hosts, **kwargs)
        raise SystemExit(f"{kwargs} was accepted")
    except ValueError:
        pass
assert dsrun._parse_hostfile(["worker-1 slots=2", "# c", "", "localhost slots=1"]) == {"worker-1": 2, "localhost": 1}
try:
    dsrun.main(args="--num_nodes 1 --num_gpus 1 -i localhost foo.py".split())
    raise SystemExit("a filter with counts was accepted")
except ValueError:
    pass
pool = {"worker-0": 4, "worker-1": 4}
world, args = encode_world_info(pool), parse_args(["test_launcher.py"])
assert OpenMPIRunner(args, world, pool).get_cmd(dict(os.environ), pool)[0] == "mpirun"
assert "eth0" in OpenMPIRunner(args, world, pool).get_cmd(dict(os.environ), pool)
assert [c(args, world, pool).get_cmd(dict(os.environ), pool)[0] for c in (MPICHRunner, MVAPICHRunner, SlurmRunner)] == [
    "mpirun", "mpirun", "srun"]
cmd, _, env = PDSHRunner(args, world).get_cmd(dict(os.environ), {"worker-0": 4})
assert cmd[0] == "pdsh" and env["PDSH_RCMD_TYPE"] == "ssh"
assert issubclass(PDSHRunner, MultiNodeRunner)
assert parse_range_list("0,2-4,6,8-9") == [0, 2, 3, 4, 6, 8, 9]
print("ok")
"""


def test_round5_launcher_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
