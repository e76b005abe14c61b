"""The training script's command line: where its DeepSpeed config is named, and the flags that
autotuning.arg_mappings ties to config keys (Hugging Face's --per_device_train_batch_size is the
micro-batch). Pure functions over argument lists; nothing here reaches a shell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dsconfig import ConfigError, Problem

from .errors import AutotuningError

CONFIG_FLAGS = ("--deepspeed_config", "--deepscale_config", "--deepspeed")


def config_argument(script_args: Sequence[str]) -> tuple[int, str]:
    """(position of the config path in `script_args`, the path)."""
    for i, arg in enumerate(script_args):
        flag, eq, value = arg.partition("=")
        if flag not in CONFIG_FLAGS:
            continue
        if eq:
            return i, value
        if i + 1 < len(script_args) and not script_args[i + 1].startswith("-"):
            return i + 1, script_args[i + 1]
        if flag != "--deepspeed":  # DeepSpeed's own --deepspeed is a switch without a value
            break
    raise AutotuningError("--autotuning needs the script's DeepSpeed config among its arguments: "
                          "--deepspeed_config FILE (or --deepspeed FILE, as Hugging Face scripts take it)")


def with_config(script_args: Sequence[str], path: str) -> list[str]:
    """`script_args` naming `path` as the config instead."""
    position, _ = config_argument(script_args)
    args = list(script_args)
    flag, eq, _ = args[position].partition("=")
    args[position] = f"{flag}={path}" if eq and flag in CONFIG_FLAGS else path
    return args


def check_arg_mappings(mappings: Mapping[str, str] | None) -> dict[str, str]:
    """{config key: script flag}, keys stripped of stray spaces; a flag must start with '-'."""
    checked: dict[str, str] = {}
    problems = []
    for key, flag in (mappings or {}).items():
        where = f"autotuning.arg_mappings.{key.strip()}"
        if not isinstance(flag, str) or not flag.startswith("-") or "=" in flag or any(c.isspace() for c in flag):
            problems.append(Problem(where, "must be the script's option that takes this value, starting with '-' "
                                           "(e.g. \"--per_device_train_batch_size\")", flag))
        else:
            checked[key.strip()] = flag
    if problems:
        raise ConfigError(problems)
    return checked


def mapped_value(script_args: Sequence[str], flag: str) -> str | None:
    """The value the script is given for `flag` (its last occurrence), or None."""
    found = None
    for i, arg in enumerate(script_args):
        if arg == flag and i + 1 < len(script_args):
            found = script_args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1:]
    return found


def with_mapped_values(script_args: Sequence[str], values: Mapping[str, object]) -> list[str]:
    """`script_args` with each {flag: value} set: every occurrence replaced, or appended when absent."""
    args = list(script_args)
    for flag, value in values.items():
        text = _text(value)
        seen = False
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args):
                args[i + 1], seen = text, True
            elif arg.startswith(flag + "="):
                args[i], seen = f"{flag}={text}", True
        if not seen:
            args += [flag, text]
    return args


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
