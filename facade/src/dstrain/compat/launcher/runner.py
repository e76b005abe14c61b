"""`deepspeed.launcher.runner`: the launcher's entry point (`main`, DeepSpeed's `deepspeed` command: dstrain's
launcher), its command-line parser and the hostfile / `--include` / `--exclude` parsers scripts and cluster tools
call, and the name of the file whose KEY=VALUE lines every node's environment gets.

Bad input is a ValueError naming it (dstrain's HostfileError / FilterError), as DeepSpeed's parsers raise."""

from __future__ import annotations

import argparse
import base64
import json

from ...launcher.cli import build_parser, joined_launcher_args, launch
from ...launcher.commands import ENV_FILES
from ...launcher.hostfile import filter_resources, parse_hostfile_text

DEEPSPEED_ENVIRONMENT_NAME = ENV_FILES[0]  # ".deepspeed_env", read from the working directory and the home folder


def parse_args(args: list[str] | None = None) -> argparse.Namespace:
    """The launcher's command line as a namespace: dstrain's options, with the script and its arguments also
    under DeepSpeed's names (`user_script`, `user_args`)."""
    import sys

    parser = build_parser()
    parsed = parser.parse_args(joined_launcher_args(parser, sys.argv[1:] if args is None else list(args)))
    parsed.user_script = parsed.script
    parsed.user_args = list(parsed.script_args)
    return parsed


def _parse_hostfile(hostfile_lines) -> dict[str, int]:
    """A hostfile's lines (`worker-1 slots=4`, comments, blank lines) as {host: slots}, in file order; a
    HostfileError (a ValueError) listing every bad line, a repeated host, or no host at all."""
    return parse_hostfile_text("\n".join(hostfile_lines))


def parse_resource_filter(host_info: dict, include_str: str = "", exclude_str: str = "") -> dict[str, list[int]]:
    """`host_info` ({host: slot ids}) narrowed by an include or an exclude filter (`worker-0@worker-1:0,2`); it may
    come out empty. A FilterError (a ValueError) for both filters at once, or a host or slot `host_info` lacks."""
    return filter_resources({host: list(slots) for host, slots in host_info.items()}, include_str, exclude_str)


def encode_world_info(world_info: dict) -> str:
    """{host: slot ids} as the URL-safe base64 of its JSON (what DeepSpeed's launcher passes to each node)."""
    return base64.urlsafe_b64encode(json.dumps(world_info).encode("utf-8")).decode("utf-8")


def main(args: list[str] | None = None) -> int:
    """Run the launcher on `args` (default: this process's arguments). A command line it cannot run raises (a
    ValueError for a bad hostfile or filter, or one combined with --num_nodes / --num_gpus), where the `deepspeed`
    and `dstrain` commands print one error line instead."""
    return launch(args)


__all__ = ["DEEPSPEED_ENVIRONMENT_NAME", "encode_world_info", "main", "parse_args", "parse_resource_filter"]
