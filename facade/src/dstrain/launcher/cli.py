"""`dstrain`: DeepSpeed's `deepspeed` command. Runs a training script on one machine or several.

    dstrain --num_procs 2 train.py --deepspeed_config ds.json
    dstrain --hostfile hosts --include "worker-0@worker-1:0,2" train.py
    dstrain --num_procs 2 --autotuning run train.py --deepspeed_config ds.json
    dstrain --launcher openmpi --launcher_args "--allow-run-as-root" --hostfile hosts train.py

See facade/docs/launcher.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

from . import _cores, mpi
from .commands import Elastic, Job, Node, exported_environment, is_local_host, node_argv_display, supervised
from .errors import LaunchError
from .hostfile import check_host, parse_hostfile, select_resources
from .mpi import MPI_LAUNCHERS
from .runner import Launch, Supervisor, check_reachable, node_launches

DEFAULT_PORT = 29500  # DeepSpeed's and torch's default
LAUNCHERS = ("auto", "ssh", "pdsh", "local", *MPI_LAUNCHERS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dstrain",
        description="Run a training script on every process of a job: on this machine through torchrun, or "
                    "across the machines of a DeepSpeed-format hostfile, one torchrun per machine over ssh.")
    count = p.add_mutually_exclusive_group()
    count.add_argument("--num_procs", type=int, default=None, metavar="N",
                       help="processes per machine (default: the GPUs of this machine, or 1 without GPUs; "
                            "with a hostfile: every slot)")
    # Its own option (not an alias of --num_procs) because srun hears of GPUs only through it (--gpus-per-node).
    count.add_argument("--num_gpus", "--num_accelerators", type=int, default=None, metavar="N",
                       help="GPUs (processes) per machine, DeepSpeed's name for --num_procs")
    p.add_argument("--num_nodes", type=int, default=None, metavar="M", help="use the first M hosts of the hostfile")
    p.add_argument("-H", "--hostfile", default=None, metavar="FILE",
                   help="DeepSpeed-format hostfile: one 'HOSTNAME slots=N' a line")
    p.add_argument("-i", "--include", default="", metavar="SPEC",
                   help="only these hosts/slots, e.g. 'worker-0@worker-1:0,2'")
    p.add_argument("-e", "--exclude", default="", metavar="SPEC",
                   help="all but these hosts/slots, e.g. 'worker-1:0' or 'worker-1'")
    p.add_argument("--master_addr", default=None, metavar="ADDR",
                   help="address of the rank-0 machine (default: the first host, 127.0.0.1 on one machine)")
    p.add_argument("--master_port", type=int, default=None, metavar="PORT",
                   help=f"TCP port of the rendezvous on the master (default: a free port on one machine, through "
                        f"torchrun's standalone rendezvous; {DEFAULT_PORT} across machines)")
    p.add_argument("--launcher", type=str.lower, choices=LAUNCHERS, default="auto",
                   help="how the job is started: one torchrun per node, remote nodes over ssh, pdsh, or auto (pdsh "
                        "where installed, else ssh); 'local' runs every node's torchrun on this machine, e.g. to try "
                        "a hostfile over loopback (hosts named localhost/127.x always run here without ssh); or every "
                        "rank by one mpirun (openmpi, mpich, impi, mvapich) or srun (slurm), as DeepSpeed's launchers")
    p.add_argument("--launcher_args", default="", metavar="ARGS",
                   help="options for the program that starts the job, as one quoted string: mpirun's or srun's, or "
                        "pdsh's / ssh's for remote nodes, e.g. --launcher_args '--allow-run-as-root'")
    p.add_argument("--no_ssh_check", action="store_true",
                   help="do not check that every remote host answers ssh / pdsh before starting")
    p.add_argument("--force_multi", action="store_true",
                   help="accepted for DeepSpeed's command lines: here remote hosts always start remotely, and "
                        "--launcher openmpi|mpich|impi|mvapich|slurm starts even one host through mpirun / srun")
    p.add_argument("--ssh_port", type=int, default=None, metavar="PORT", help="ssh port of the remote hosts")
    p.add_argument("--no_ssh", action="store_true",
                   help="start only this machine's node (give --node_rank); run the same command on every machine")
    p.add_argument("--node_rank", type=int, default=None, metavar="R", help="this machine's rank, with --no_ssh")
    p.add_argument("--no_local_rank", action="store_true",
                   help="do not pass --local_rank=N to the script (LOCAL_RANK is always set)")
    p.add_argument("--module", action="store_true", help="the script is a module name, run as `python -m`")
    p.add_argument("--no_deepspeed_alias", action="store_true",
                   help="do not resolve the script's `import deepspeed` to dstrain (by default it is, where no "
                        "real DeepSpeed is installed)")
    p.add_argument("--bind_cores_to_rank", action="store_true",
                   help="pin each process to its own equal share of the machine's cores (numactl where installed, "
                        "else the process's CPU affinity) and set OMP_NUM_THREADS to the share's size")
    p.add_argument("--bind_core_list", default=None, metavar="LIST",
                   help="the cores to share out instead of every core, e.g. '0,2-5,7' (implies --bind_cores_to_rank)")
    p.add_argument("--stop_grace", type=float, default=10.0, metavar="SECONDS",
                   help="when stopping a job, seconds between SIGTERM and SIGKILL (default 10)")
    p.add_argument("--elastic_training", action="store_true",
                   help="elastic training, as DeepSpeed's: each node's torchrun joins a c10d rendezvous at "
                        "--master_addr:--master_port, so nodes may leave (the rest go on, down to "
                        "--min_elastic_nodes) or join (the same command started on another machine, up to "
                        "--max_elastic_nodes); every change restarts the ranks at the new size, which resume from "
                        "the script's checkpoint (the config's elasticity section keeps the global batch)")
    p.add_argument("--min_elastic_nodes", type=int, default=-1, metavar="N",
                   help="with --elastic_training: the fewest nodes the job runs on (default 1)")
    p.add_argument("--max_elastic_nodes", type=int, default=-1, metavar="N",
                   help="with --elastic_training: the most nodes the job grows to (default: the nodes started)")
    p.add_argument("--rdzv_conf", default="", metavar="K=V,...",
                   help="with --elastic_training: torchrun's rendezvous settings, e.g. 'last_call_timeout=5' (how "
                        "long a round waits for more nodes once it has the fewest; torch's default 30 s)")
    p.add_argument("--dry_run", action="store_true", help="print each node's command and exit")
    p.add_argument("--autotuning", choices=("tune", "run"), default=None,
                   help="find the fastest ZeRO stage, micro-batch and knobs by short runs of the script (the "
                        "config's autotuning section); 'tune' writes the results, 'run' then trains with the best "
                        "(see facade/docs/autotuning.md)")
    p.add_argument("--autotuning_timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="with --autotuning: stop an experiment after this long and record it as timed out "
                        "(default 1800)")
    p.add_argument("script", help="the training script (or module, with --module)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def local_gpu_count(environ: dict[str, str] | None = None) -> int:
    """GPUs visible here, found without importing torch (which would add seconds to every launch)."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len([n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)])
    except OSError:
        return 0


def plan(args: argparse.Namespace, environ: dict[str, str] | None = None) -> tuple[Job, list[Node]]:
    """Turn the command line into a Job and the nodes this launcher starts."""
    environ = dict(os.environ if environ is None else environ)
    per_node = args.num_procs if args.num_procs is not None else args.num_gpus
    if args.hostfile:
        hosts = parse_hostfile(args.hostfile)
        resources = select_resources(hosts, args.include, args.exclude, args.num_nodes, per_node)
        visible_devices = True
    else:
        if args.num_nodes not in (None, 1):
            raise LaunchError(f"--num_nodes {args.num_nodes} needs a --hostfile listing the machines")
        slots = per_node or local_gpu_count(environ) or 1
        # The counts go in too, so that a filter with a count is refused here as with a hostfile.
        resources = select_resources({"localhost": slots}, args.include, args.exclude, args.num_nodes, per_node)
        visible_devices = bool(args.include or args.exclude)  # otherwise keep the user's own setting
    job = job_for(args, resources, visible_devices, environ)
    nodes = job.nodes
    if args.no_ssh:
        if args.node_rank is None or not 0 <= args.node_rank < len(nodes):
            raise LaunchError(f"--no_ssh needs --node_rank between 0 and {len(nodes) - 1} (this machine's place "
                              "in the hostfile)")
        if args.master_addr is None and len(nodes) > 1:
            raise LaunchError("--no_ssh across machines needs --master_addr (the address of node 0)")
        mine = nodes[args.node_rank]
        return job, [Node(mine.host, mine.rank, mine.slots, True)]
    if args.node_rank is not None:
        raise LaunchError("--node_rank is only for --no_ssh, where each machine starts its own node")
    return job, list(nodes)


def job_for(args: argparse.Namespace, resources: dict[str, list[int]], visible_devices: bool = True,
            environ: dict[str, str] | None = None) -> Job:
    """The Job the command line `args` asks for on `resources` (host -> slot ids, the hosts in node order)."""
    environ = dict(os.environ if environ is None else environ)
    force_local = args.launcher == "local"
    nodes = tuple(Node(host, rank, tuple(slots), force_local or is_local_host(host))
                  for rank, (host, slots) in enumerate(resources.items()))
    master = args.master_addr
    if master is not None:
        check_host(master, "--master_addr")  # it reaches every node's torchrun, remote ones through a shell
    else:
        first = nodes[0].host
        if all(n.local for n in nodes):
            master = "127.0.0.1"
        else:
            master = first if not is_local_host(first) else _this_host_name()
    port = args.master_port
    elastic = elastic_for(args, nodes, environ)
    if port is None and (len(nodes) > 1 or args.launcher in MPI_LAUNCHERS or elastic is not None):
        port = DEFAULT_PORT  # every machine must know it in advance; one torchrun picks a free one (standalone)
    try:
        launcher_args = tuple(shlex.split(args.launcher_args))
    except ValueError as exc:
        raise LaunchError(f"--launcher_args {args.launcher_args!r}: {exc} (give them as one string, quoted as "
                          "for a shell)") from None
    if launcher_args and args.launcher == "local":
        raise LaunchError("--launcher_args: --launcher local starts no program to pass them to; they are for "
                          "mpirun / srun (--launcher openmpi|mpich|impi|mvapich|slurm) or ssh / pdsh")
    if args.launcher in MPI_LAUNCHERS:
        for flag, given in (("--no_ssh", args.no_ssh), ("--node_rank", args.node_rank is not None),
                            ("--ssh_port", args.ssh_port is not None)):
            if given:
                raise LaunchError(f"{flag} is for the ssh / pdsh launchers; with --launcher {args.launcher} "
                                  f"{mpi.PROGRAM[args.launcher]} reaches the hosts itself (give its options in "
                                  "--launcher_args)")
    job = Job(script=args.script, script_args=tuple(args.script_args), nodes=nodes, master_addr=master,
              master_port=port, python=sys.executable, cwd=os.getcwd(),
              local_rank_arg=not args.no_local_rank, module=args.module,
              set_visible_devices=visible_devices,
              extra_env={**exported_environment(environ), **({"DSTRAIN_DEEPSPEED_ALIAS": "0"}
                                                              if args.no_deepspeed_alias else {})},
              grace=args.stop_grace, bind_cores=core_binding(args, nodes), launcher_args=launcher_args,
              elastic=elastic)
    return job


ELASTIC_RUN_ID = "ELASTIC_RUN_ID"  # DeepSpeed's variable naming the rendezvous of an elastic job
# torchrun's rendezvous settings (c10d backend); a typo would otherwise be ignored and the default used.
RDZV_CONF_KEYS = ("join_timeout", "last_call_timeout", "close_timeout", "timeout", "read_timeout", "is_host",
                  "keep_alive_interval", "keep_alive_max_attempt", "heartbeat_timeout")


def elastic_for(args: argparse.Namespace, nodes: tuple[Node, ...], environ: dict[str, str]) -> Elastic | None:
    """The elastic settings `--elastic_training` asks for, checked (None without it)."""
    asked = [flag for flag, given in (("--min_elastic_nodes", args.min_elastic_nodes != -1),
                                      ("--max_elastic_nodes", args.max_elastic_nodes != -1),
                                      ("--rdzv_conf", bool(args.rdzv_conf))) if given]
    if not args.elastic_training:
        if asked:
            raise LaunchError(f"{', '.join(asked)}: only with --elastic_training")
        return None
    if args.launcher in MPI_LAUNCHERS:
        raise LaunchError(f"--elastic_training: with --launcher {args.launcher} one {mpi.PROGRAM[args.launcher]} "
                          "starts every rank and cannot change their number; use the ssh or pdsh launcher (one "
                          "torchrun per node), as DeepSpeed does")
    if args.no_ssh and args.master_addr is None:
        raise LaunchError("--elastic_training --no_ssh needs --master_addr: every machine that joins must reach the "
                          "same rendezvous")
    low = 1 if args.min_elastic_nodes == -1 else args.min_elastic_nodes
    high = len(nodes) if args.max_elastic_nodes == -1 else args.max_elastic_nodes
    if low < 1 or high < low:
        raise LaunchError(f"--min_elastic_nodes {low} / --max_elastic_nodes {high}: need 1 <= min <= max")
    for item in filter(None, args.rdzv_conf.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in RDZV_CONF_KEYS or not re.fullmatch(r"[A-Za-z0-9_.-]+", value.strip()):
            raise LaunchError(f"--rdzv_conf {args.rdzv_conf!r}: {item!r} is not KEY=VALUE with KEY one of "
                              f"{', '.join(RDZV_CONF_KEYS)}")
    run_id = environ.get(ELASTIC_RUN_ID, "dstrain-elastic")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", run_id):
        raise LaunchError(f"{ELASTIC_RUN_ID}={run_id!r}: a rendezvous id is letters, digits, '_', '.' and '-'")
    return Elastic(low, high, run_id, args.rdzv_conf.replace(" ", ""))


def mpi_job(args: argparse.Namespace, job: Job, environ: dict[str, str] | None = None) -> mpi.MpiJob:
    """The job as one mpirun / srun runs it (--launcher openmpi|mpich|impi|mvapich|slurm), checked."""
    mj = mpi.MpiJob(args.launcher, job, job.launcher_args, filtered=bool(args.hostfile and (args.include or args.exclude)),
                    num_nodes=args.num_nodes, num_gpus=args.num_gpus, master_addr_given=args.master_addr is not None,
                    cuda=local_gpu_count(environ) > 0)
    mpi.check(mj)
    return mj


def core_binding(args: argparse.Namespace, nodes: tuple[Node, ...]) -> str | None:
    """What the ranks bind to ('all', a checked core list, or None for no binding). On nodes that run
    here the cores are checked now; on the others each rank checks them before the script starts."""
    if not args.bind_cores_to_rank and args.bind_core_list is None:
        return None
    try:
        if args.bind_core_list is not None:
            cores = _cores.parse_core_list(args.bind_core_list)
            for node in nodes:
                if not node.local and len(cores) < len(node.slots):
                    raise ValueError(f"--bind_core_list {args.bind_core_list!r} has {len(cores)} core(s) for the "
                                     f"{len(node.slots)} processes of {node.host}; each needs at least one core")
        for node in nodes:
            if node.local:
                _cores.node_cores(args.bind_core_list, len(node.slots), "this machine")
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    return "all" if args.bind_core_list is None else ",".join(map(str, cores))


def _this_host_name() -> str:
    import socket

    return socket.getfqdn()


def remote_shell_for(choice: str) -> str:
    if choice in ("ssh", "pdsh"):
        return choice
    import shutil

    return "pdsh" if shutil.which("pdsh") else "ssh"


def joined_launcher_args(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--launcher_args '--allow-run-as-root'` as `--launcher_args=...`: argparse takes a lone value that starts
    with '-' for an option and stops. Only the launcher's own options (before the script) are looked at."""
    takes_value = {flag for action in parser._actions if action.option_strings and action.nargs is None
                   for flag in action.option_strings}  # argparse keeps no public list; stable since 2.7
    argv = list(argv)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--launcher_args" and i + 1 < len(argv):
            argv[i:i + 2] = [f"--launcher_args={argv[i + 1]}"]
        elif argv[i] in takes_value:
            i += 1  # skip its value
        i += 1
    return argv


def main(argv: list[str] | None = None) -> int:
    """The `dstrain` command: a bad command line is one `dstrain: error:` line and exit status 2."""
    try:
        return launch(argv)
    except LaunchError as exc:
        print(f"dstrain: error: {exc}", file=sys.stderr)
        return 2


def launch(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: this process's arguments) and run the job; a LaunchError (a FilterError or a
    HostfileError, both ValueErrors, for a bad filter or hostfile) when it cannot start as asked."""
    parser = build_parser()
    args = parser.parse_args(joined_launcher_args(parser, sys.argv[1:] if argv is None else argv))
    if args.autotuning:
        from ..autotuning.command import main as autotuning_main  # imports torch: only when asked

        return autotuning_main(args, parser)
    job, to_start = plan(args)
    if args.launcher in MPI_LAUNCHERS:
        return run_mpi(mpi_job(args, job), args.dry_run)
    shell = remote_shell_for(args.launcher)
    if args.dry_run:
        for node in to_start:
            print(f"# node {node.rank} ({node.host}, slots {','.join(map(str, node.slots))})")
            print(node_argv_display(job, node, shell, args.ssh_port))
        return 0
    if not args.no_ssh_check:
        check_reachable([n.host for n in to_start if not n.local], shell, args.ssh_port,
                        options=job.launcher_args)
    elastic_min = job.elastic.min_nodes if job.elastic is not None else None
    return Supervisor(node_launches(job, to_start, shell, args.ssh_port), job.cwd, job.grace, elastic_min).run()


def run_mpi(mj: mpi.MpiJob, dry_run: bool = False) -> int:
    """Start every rank with one mpirun / srun and supervise it as a node (signals, parent death, orphans)."""
    program = mpi.PROGRAM[mj.flavour]
    hosts = mpi.hostfile_text(mj)
    if dry_run:
        if hosts is not None:
            print("# <hostfile>, written to a private temporary folder at launch:")
            print("".join(f"#   {line}\n" for line in hosts.splitlines()), end="")
        print(f"# run by the node agent, which stops {program} and what it leaves if the launcher dies:")
        print(shlex.join(mpi.command(mj, "<hostfile>" if hosts is not None else None)))
        return 0
    import shutil
    import tempfile

    if shutil.which(mpi.PROBE[mj.flavour]) is None or shutil.which(program) is None:
        raise LaunchError(f"--launcher {mj.flavour}: {mpi.TITLE[mj.flavour]}'s {mpi.PROBE[mj.flavour]!r} is not "
                          f"on the PATH; install it ({mpi.INSTALL[mj.flavour]}), or use --launcher ssh")
    with tempfile.TemporaryDirectory(prefix="dstrain-hosts-") as folder:  # mode 0700: only we read it
        hostfile = None
        if hosts is not None:
            hostfile = os.path.join(folder, "hostfile")
            with open(os.open(hostfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(hosts)
        # Under the node agent, as torchrun is: its keeper is a subreaper, so what a rank leaves (a helper in a
        # session of its own) is still stopped when mpirun, or the launcher, dies. srun's tasks are SLURM's: it
        # stops every process of a step when the step ends.
        argv = supervised(mj.job, mpi.command(mj, hostfile))
        env = {**os.environ, **mpi.exports(mj)}
        return Supervisor([Launch(program, f"[{program}] ", tuple(argv), env)], mj.job.cwd, mj.job.grace).run()


if __name__ == "__main__":
    sys.exit(main())
