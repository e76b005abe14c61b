"""DeepSpeedTransformerConfig: DeepSpeed's signature and defaults, each value checked when given.

-1 means "not set", as in DeepSpeed. Values that are set are checked at once (every problem reported
together); what a layer needs (sizes, dropout ratios, and for its own initialisation the initializer range
and layer count) is checked when a DeepSpeedTransformerLayer is built from the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsconfig.errors import ConfigError, Problem

UNSET = -1
_SOURCE = "DeepSpeedTransformerConfig"
_FLAGS = ("fp16", "pre_layer_norm", "normalize_invertible", "gelu_checkpoint", "adjust_init_range",
          "attn_dropout_checkpoint", "stochastic_mode", "return_tuple", "training")
# Set by the layer, present in a config dumped from DeepSpeed's __dict__; accepted by from_dict.
_RUNTIME_KEYS = ("layer_id", "test_gemm", "is_grad_enabled")


class TransformerConfig:
    """The sizes and ratios every transformer layer config has (DeepSpeed's base class)."""

    def __init__(self, batch_size, hidden_size, intermediate_size, heads, attn_dropout_ratio, hidden_dropout_ratio,
                 num_hidden_layers, initializer_range):
        self.layer_id = -1
        self.batch_size = batch_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.heads = heads
        self.attn_dropout_ratio = attn_dropout_ratio
        self.hidden_dropout_ratio = hidden_dropout_ratio
        self.num_hidden_layers = num_hidden_layers
        self.initializer_range = initializer_range


class DeepSpeedTransformerConfig(TransformerConfig):
    """The configuration of a DeepSpeedTransformerLayer, with DeepSpeed's arguments and defaults.

    intermediate_size <= 0 means 4 * hidden_size. seed -1 draws each call's dropout seed from torch's
    generator (so torch.manual_seed and activation checkpointing's RNG restore govern it); a seed >= 0 gives
    masks that depend on (seed, layer_id, call count) only. stochastic_mode is accepted and changes nothing:
    these kernels are deterministic. fp16 is informational: the layer computes in its parameters' dtype.
    """

    def __init__(self, batch_size=-1, hidden_size=-1, intermediate_size=-1, heads=-1, attn_dropout_ratio=-1,
                 hidden_dropout_ratio=-1, num_hidden_layers=-1, initializer_range=-1, layer_norm_eps=1e-12,
                 local_rank=-1, seed=-1, fp16=False, pre_layer_norm=True, normalize_invertible=False,
                 gelu_checkpoint=False, adjust_init_range=True, attn_dropout_checkpoint=False, stochastic_mode=False,
                 return_tuple=False, training=True):
        _check_arguments(locals())
        super().__init__(batch_size, hidden_size, intermediate_size if intermediate_size > 0 else 4 * hidden_size,
                         heads, attn_dropout_ratio, hidden_dropout_ratio, num_hidden_layers, initializer_range)
        self.fp16 = fp16
        self.pre_layer_norm = pre_layer_norm
        self.local_rank = local_rank
        self.seed = seed
        self.normalize_invertible = normalize_invertible
        self.gelu_checkpoint = gelu_checkpoint
        self.adjust_init_range = adjust_init_range
        self.test_gemm = False
        self.layer_norm_eps = layer_norm_eps
        self.training = training
        self.is_grad_enabled = True
        self.attn_dropout_checkpoint = attn_dropout_checkpoint
        self.stochastic_mode = stochastic_mode
        self.return_tuple = return_tuple

    @classmethod
    def from_dict(cls, json_object: dict[str, Any]) -> DeepSpeedTransformerConfig:
        """A config from a dict of its arguments (a dumped config's layer_id/test_gemm/is_grad_enabled pass)."""
        if not isinstance(json_object, dict):
            raise ConfigError(Problem("", f"expected a dict of DeepSpeedTransformerConfig arguments, got "
                                          f"{type(json_object).__name__}"), source=_SOURCE)
        known = set(cls.__init__.__code__.co_varnames[1:cls.__init__.__code__.co_argcount])
        unknown = sorted(set(json_object) - known - set(_RUNTIME_KEYS))
        if unknown:
            raise ConfigError([Problem(key, f"not an argument of DeepSpeedTransformerConfig; valid: "
                                            f"{', '.join(sorted(known))}") for key in unknown], source=_SOURCE)
        config = cls(**{key: value for key, value in json_object.items() if key in known})
        for key in _RUNTIME_KEYS:
            if key in json_object:
                setattr(config, key, json_object[key])
        return config

    @classmethod
    def from_json_file(cls, json_file: str | Path) -> DeepSpeedTransformerConfig:
        """A config from a JSON file (UTF-8, or UTF-16 as DeepSpeed writes it: the encoding is detected)."""
        try:
            data = json.loads(Path(json_file).read_bytes())
        except (OSError, ValueError) as err:
            raise ConfigError(Problem("", f"cannot read a JSON config: {err}"), source=str(json_file)) from err
        return cls.from_dict(data)

    def __repr__(self) -> str:
        return f"DeepSpeedTransformerConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_arguments(args: dict[str, Any]) -> None:
    problems = []
    for name in ("batch_size", "hidden_size", "heads", "num_hidden_layers"):
        value = args[name]
        if not _is_int(value) or (value != UNSET and value < 1):
            problems.append(Problem(name, "must be a positive int, or -1 for not set", value))
    if not _is_int(args["intermediate_size"]):
        problems.append(Problem("intermediate_size", "must be an int (<= 0 means 4 * hidden_size)",
                                args["intermediate_size"]))
    hidden, heads = args["hidden_size"], args["heads"]
    if _is_int(hidden) and _is_int(heads) and hidden > 0 and heads > 0 and hidden % heads:
        problems.append(Problem("heads", f"must divide hidden_size {hidden} (each head gets hidden_size / heads "
                                         f"features); divisors up to 64: "
                                         f"{[d for d in range(1, min(hidden, 64) + 1) if hidden % d == 0]}", heads))
    for name in ("attn_dropout_ratio", "hidden_dropout_ratio"):
        value = args[name]
        if not _is_number(value) or (value != UNSET and not 0 <= value < 1):
            problems.append(Problem(name, "must be in [0, 1) (0 turns dropout off), or -1 for not set", value))
    value = args["initializer_range"]
    if not _is_number(value) or (value != UNSET and value < 0):
        problems.append(Problem("initializer_range", "must be >= 0 (a standard deviation), or -1 for not set", value))
    if not _is_number(args["layer_norm_eps"]) or not args["layer_norm_eps"] > 0:
        problems.append(Problem("layer_norm_eps", "must be a positive number", args["layer_norm_eps"]))
    for name in ("local_rank", "seed"):
        if not _is_int(args[name]) or args[name] < -1:
            problems.append(Problem(name, "must be an int >= 0, or -1 for not set", args[name]))
    problems += [Problem(name, "must be True or False", args[name]) for name in _FLAGS
                 if not isinstance(args[name], bool)]
    if problems:
        raise ConfigError(problems, source=_SOURCE)


def check_buildable(config: DeepSpeedTransformerConfig, initializes: bool) -> None:
    """Refuses a config a layer cannot be built from, naming every argument still missing or wrong.

    Checked here rather than in the constructor because DeepSpeed builds configs with every value unset
    and fills them in afterwards (from_dict, attribute assignment).
    """
    problems = []
    try:
        _check_arguments({name: getattr(config, name) for name in (
            "batch_size", "hidden_size", "intermediate_size", "heads", "attn_dropout_ratio", "hidden_dropout_ratio",
            "num_hidden_layers", "initializer_range", "layer_norm_eps", "local_rank", "seed", *_FLAGS)})
    except ConfigError as err:
        problems += err.problems
    except AttributeError as err:
        problems.append(Problem("", f"not a DeepSpeedTransformerConfig: {err}"))
    if not problems:
        for name in ("hidden_size", "heads", "attn_dropout_ratio", "hidden_dropout_ratio"):
            if getattr(config, name) == UNSET:
                problems.append(Problem(name, "is not set (-1); a layer needs it" + (
                    " (a ratio in [0, 1); 0 turns dropout off)" if "ratio" in name else "")))
        if config.intermediate_size <= 0:
            problems.append(Problem("intermediate_size", "is not set; give it or hidden_size (4 * hidden_size)",
                                    config.intermediate_size))
        if initializes and config.initializer_range == UNSET:
            problems.append(Problem("initializer_range", "is not set (-1); the layer initialises its weights "
                                                         "with it (BERT uses 0.02)"))
        if initializes and config.adjust_init_range and config.num_hidden_layers == UNSET:
            problems.append(Problem("num_hidden_layers", "is not set (-1); adjust_init_range scales the output "
                                                         "weights' init by 1/sqrt(2 * num_hidden_layers)"))
    if problems:
        raise ConfigError(problems, source=_SOURCE)
