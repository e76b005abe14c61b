"""Where `initialize()` gets its config: `config`, `config_params` or `args.deepspeed_config`, resolved
at the data-parallel world size, with every "auto" placeholder refused by name."""

from __future__ import annotations

import os
import warnings
from typing import Any

import dsconfig
from dsconfig import ConfigError, DeepSpeedConfig, Problem


def pick_source(args: Any, config: Any, config_params: Any) -> Any:
    """Exactly one of the three ways to pass a config; two different ones is an error."""
    from_args = None
    if args is not None:
        from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if config is not None and config_params is not None and config is not config_params:
        raise ConfigError(Problem("config_params", "both config= and config_params= were given; pass one"))
    given = config if config is not None else config_params
    if given is not None and from_args is not None:
        raise ConfigError(Problem("args.deepspeed_config",
                                  f"a config was passed to initialize() and --deepspeed_config={from_args!r} too; "
                                  f"pass one of them"))
    source = given if given is not None else from_args
    if source is None:
        raise ConfigError(Problem("config", "no DeepSpeed config: pass initialize(config=<path or dict>), "
                                            "config_params=..., or --deepspeed_config <file> (add_config_arguments)"))
    if isinstance(source, (str, os.PathLike)) and not os.path.exists(source) and not _looks_like_base64(source):
        raise ConfigError(Problem("config", f"file not found: {os.fspath(source)!r}"))
    return source


def _looks_like_base64(text: Any) -> bool:
    return isinstance(text, str) and not text.endswith(".json") and len(text) > 16 and "/" not in text[:8]


def load_config(source: Any, data_parallel_size: int, *, strict: bool = False) -> DeepSpeedConfig:
    """A complete config: batch triple resolved at `data_parallel_size`, no "auto" left.

    Unknown keys warn rather than fail by default (strict=False), as DeepSpeed ignores them; the
    values of known keys are always checked.
    """
    if isinstance(source, DeepSpeedConfig):
        cfg = source
        if cfg.data_parallel_size != data_parallel_size and cfg.is_batch_resolved():
            cfg = dsconfig.load(cfg.to_dict(), world_size=data_parallel_size, strict=True)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("always", dsconfig.ConfigWarning)
            cfg = dsconfig.load(source, world_size=data_parallel_size, strict=strict)
    if not cfg.is_batch_resolved():
        cfg = cfg.with_batch_size(world_size=data_parallel_size)
    left = cfg.unresolved_auto()
    if left:
        raise ConfigError([Problem(path, 'is still "auto": give it a value (the Hugging Face Trainer fills '
                                         'these in; a plain script must)') for path in left])
    return cfg
