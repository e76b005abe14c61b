"""`dstrain --autotuning tune|run ...`: the launcher's job, tuned.

    dstrain --num_procs 8 --autotuning run train.py --deepspeed_config ds_config.json

The job is planned as the launcher would run it; each experiment is the same launcher command with the
point's config (and the script flags autotuning.arg_mappings names) in place of the user's. `tune`
writes the results and stops; `run` then trains with ds_config_optimal.json.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dsconfig

from ..launcher import dies_with_parent
from ..launcher.cli import plan
from ..launcher.errors import LaunchError
from .configs import config_problems, experiment_config, get_path, optimal_config
from .engine_metrics import METRICS_ENV
from .errors import AutotuningError
from .experiments import ExperimentRunner
from .outputs import RESULT_NAMES, progress_line, summary_text, write_results
from .request import TuningRequest, read_request
from .script_args import config_argument, with_config, with_mapped_values
from .search import Search
from .space import stage_points

OWN_OPTIONS = ("autotuning", "autotuning_timeout")  # not passed on to the experiments' launcher


def say(message: str) -> None:
    print(f"dstrain autotuning: {message}", file=sys.stderr, flush=True)


def launcher_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The launcher options of `args` as a command line again, less the autotuning ones."""
    argv: list[str] = []
    for action in parser._actions:  # argparse keeps no public list; this one is stable since Python 2.7
        if not action.option_strings or action.dest in OWN_OPTIONS or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value == action.default or value is None:
            continue
        flag = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def _display(argv: list[str]) -> str:
    """The command as a user would type it: `dstrain ...` for the launcher module."""
    if argv[1:3] == ["-m", "dstrain.launcher"]:
        return shlex.join(["dstrain", *argv[3:]])
    return shlex.join(argv)


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        return _tune(args, parser)
    except (LaunchError, AutotuningError, dsconfig.ConfigError) as exc:
        print(f"dstrain: error: {exc}", file=sys.stderr)
        return 2


def _tune(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.no_ssh or args.dry_run:
        raise LaunchError(f"--autotuning runs whole jobs from this machine; it does not combine with "
                          f"{'--no_ssh' if args.no_ssh else '--dry_run'}")
    if args.autotuning_timeout <= 0:
        raise LaunchError(f"--autotuning_timeout {args.autotuning_timeout}: give the seconds an experiment may take")
    job, _ = plan(args)
    world = sum(len(node.slots) for node in job.nodes)
    _, config_path = config_argument(args.script_args)
    raw, _ = dsconfig.read_source(config_path)
    request = read_request(raw, world_size=world, script_args=args.script_args)
    settings = request.settings
    _check_base_config(request)
    options = launcher_options(parser, args)

    def command(path: str, config: Mapping[str, Any]) -> list[str]:
        script_args = with_config(args.script_args, path)
        mapped = {flag: get_path(config, key) for key, flag in request.arg_mappings.items()
                  if get_path(config, key) is not None}
        return [sys.executable, "-m", "dstrain.launcher", *options, args.script,
                *with_mapped_values(script_args, mapped)]

    results_dir, exps_dir = Path(settings.results_dir), Path(settings.exps_dir)
    runner = ExperimentRunner(raw, metric=request.metric, end_step=settings.end_profile_step, exps_dir=exps_dir,
                              results_dir=results_dir, command=command, overwrite=settings.overwrite,
                              timeout=args.autotuning_timeout, grace=args.stop_grace + 15, display=_display,
                              description={"num_gpus": len(job.nodes[0].slots), "num_nodes": len(job.nodes),
                                           "world_size": world, "data_parallel_size": request.data_parallel})
    runner.results.refuse_links(RESULT_NAMES)  # the session's last writes: a link there fails now, not after it
    if not settings.enabled:
        say("the config's autotuning.enabled is false; tuning anyway, as --autotuning asks")
    say(f"tuning {args.script} on {world} process(es) (data-parallel {request.data_parallel}): ZeRO stage(s) "
        f"{', '.join(map(str, request.stages))}, metric {request.metric}, tuner {settings.tuner_type}, "
        f"fast {str(settings.fast).lower()}; experiments in {exps_dir}/, results in {results_dir}/")
    search = Search(request, runner, progress=lambda p: say(progress_line(p, request.metric)))
    try:
        result = search.run()
    except KeyboardInterrupt:
        write_results(search.result, runner.results)
        say(f"interrupted; the experiments so far are in {results_dir}/summary.txt")
        return 130
    print(summary_text(result), flush=True)
    best = result.best
    if best is None:
        write_results(result, runner.results)
        raise AutotuningError(f"no experiment succeeded; each one's output is in {results_dir}/<name>/stderr.log "
                              f"(summary: {results_dir}/summary.txt)")
    optimal_path = results_dir / "ds_config_optimal.json"
    optimal = optimal_config(raw, best.point)
    final = command(str(optimal_path), optimal)
    write_results(result, runner.results, optimal=optimal, optimal_command=_display(final))
    say(f"best: {best.point.name} ({request.metric} {best.value(request.metric):.4g}); config in {optimal_path}, "
        f"command in {results_dir / 'cmd_optimal.txt'}")
    if args.autotuning == "tune":
        return 0
    say(f"training with {optimal_path}: {_display(final)}")
    return _train(final)


def _check_base_config(request: TuningRequest) -> None:
    """The user's config at the first point must load before anything is launched: what is wrong there
    is wrong in every experiment."""
    limits = request.limits
    micro = min(request.micro_batches) if request.micro_batches else request.min_micro_batch
    triple = limits.triple(micro) or limits.triple(max(limits.allowed(1, limits.largest_micro_batch()), default=1))
    if triple is None:
        raise AutotuningError(f"no micro-batch size fits the batch limits (data-parallel size {limits.data_parallel}, "
                              f"train_batch_size {limits.train_batch_size}, max_train_batch_size "
                              f"{limits.max_train_batch_size})")
    point = stage_points(request.stages[0], [triple], {})[0]
    problems = config_problems(experiment_config(request.raw, point), request.data_parallel)
    if problems:
        raise dsconfig.ConfigError(problems)


def _train(argv: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != METRICS_ENV}
    proc = subprocess.Popen(argv, env=env, preexec_fn=dies_with_parent(signal.SIGTERM))  # ends with us
    try:
        return proc.wait()
    except KeyboardInterrupt:  # the launcher got the terminal's SIGINT too and stops its nodes
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 130
