"""Where `initialize()` gets its config: `config`, `config_params` or `args.deepspeed_config`, resolved
at the data-parallel world size, "auto" tuning knobs resolved by dsconfig's table, every other
"auto" placeholder refused by name, and offload sizes held to what this machine has."""

from __future__ import annotations

import os
import warnings
from typing import Any

import dsconfig
import dszero
from dsconfig import ConfigError, DeepSpeedConfig, Problem
from dsconfig.config import BATCH_KEYS


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
    # A path that is plainly a file name; other strings may be base64 or JSON text, which dsconfig reads.
    named_file = isinstance(source, os.PathLike) or (isinstance(source, str) and source.endswith(".json"))
    if named_file and not os.path.exists(source):
        raise ConfigError(Problem("config", f"file not found: {os.fspath(source)!r}"))
    return source


def load_config(source: Any, data_parallel_size: int, *, strict: bool = False,
                hidden_size: int | None = None) -> tuple[DeepSpeedConfig, dict | None]:
    """A complete config (batch triple resolved at `data_parallel_size`, no "auto" left) and the raw dict
    it was read from (None for an already-built config), the source read once.

    Unknown keys warn rather than fail by default (strict=False), as DeepSpeed ignores them; the
    values of known keys are always checked. "auto" tuning knobs (bucket sizes, ...) get dsconfig's
    numbers (Hugging Face's rules from `hidden_size` where known); any other "auto" is refused.
    """
    from ..compat.runtime.config import DeepSpeedConfig as DeepSpeedsConfig

    if isinstance(source, DeepSpeedsConfig):  # DeepSpeed's class built by the script: its dsconfig config
        source = source.config
    if isinstance(source, DeepSpeedConfig):
        raw = None
        cfg = source
        if cfg.data_parallel_size != data_parallel_size and cfg.is_batch_resolved():
            data = cfg.to_dict()
            if cfg.elasticity.enabled:  # its batch is elasticity's pick at the old size: pick again at this one
                data = {key: value for key, value in data.items() if key not in BATCH_KEYS}
            cfg = dsconfig.load(data, world_size=data_parallel_size, strict=True)
    else:
        raw, name = dsconfig.read_source(source)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", dsconfig.ConfigWarning)
                cfg = dsconfig.load(raw, world_size=data_parallel_size, strict=strict)
        except ConfigError as exc:
            if name and not exc.source:  # name the file, as dsconfig.load(path) would
                raise ConfigError(exc.problems, source=name) from None
            raise
    if not cfg.is_batch_resolved():
        cfg = cfg.with_batch_size(world_size=data_parallel_size)
    cfg = dsconfig.resolve_auto(cfg, hidden_size=hidden_size)
    left = cfg.unresolved_auto()
    if left:
        raise ConfigError([Problem(path, 'is still "auto": give it a value (the Hugging Face Trainer fills '
                                         'these in; a plain script must)') for path in left])
    # Sizes this machine cannot give (NVMe offload's buffers, the aio queue) are refused here, by key, not
    # when the buffers exhaust the host or the first swap fails.
    dszero.check_offload_resources(cfg.zero_optimization, cfg.aio)
    return cfg, raw
