"""`dsconfig check | schema | defaults`: the config library from the shell."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .config import DeepSpeedConfig
from .errors import ConfigError
from .loader import load
from .schema import json_schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsconfig", description="Check and explain DeepSpeed config files.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a config and print what it resolves to")
    check.add_argument("config", help="path to a ds_config.json (or base64-encoded JSON)")
    check.add_argument("--world-size", type=int, default=1, help="data-parallel size to resolve batch sizes at")
    check.add_argument("--strict", action=argparse.BooleanOptionalAction, default=False,
                       help="treat unknown and unsupported keys as errors (default: warnings)")
    check.add_argument("--json", action="store_true", help="print the fully resolved config as JSON")
    commands.add_parser("schema", help="print a JSON Schema of the whole config")
    commands.add_parser("defaults", help="print the full default config")
    args = parser.parse_args(argv)

    if args.command == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    if args.command == "defaults":
        print(json.dumps(DeepSpeedConfig().to_dict(), indent=2))
        return 0
    return _check(args.config, args.world_size, args.strict, args.json)


def _check(source: str, world_size: int, strict: bool, as_json: bool) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = load(source, world_size=world_size, strict=strict)
        except ConfigError as exc:
            _print_warnings(caught)
            print(f"INVALID: {exc}", file=sys.stderr)
            return 1
    if as_json:
        print(json.dumps(cfg.to_dict(), indent=2))
        _print_warnings(caught)
        return 0
    print(f"OK: {source} (world size {world_size})")
    triple = ", ".join(f"{key}={getattr(cfg, key)}" for key in
                       ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))
    print(f"  batch: {triple}")
    unresolved = cfg.unresolved_auto()
    if unresolved:
        print(f"  still \"auto\" (to be filled in by a launcher or cfg.with_batch_size()): {', '.join(unresolved)}")
    features = cfg.enabled_features()
    print(f"  enabled: {', '.join(features) if features else 'plain data parallel, fp32'}")
    _print_warnings(caught)
    return 0


def _print_warnings(caught: list[warnings.WarningMessage]) -> None:
    for warning in caught:
        print(f"  warning: {warning.message}", file=sys.stderr)
