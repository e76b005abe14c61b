"""Which keys a config may carry: the schema's own, old spellings, and DeepSpeed keys dstrain lacks.

One table says what happens to every key that is not a field of the schema:
- renamed: an old spelling; moved to the new key with a deprecation warning;
- alias: another current spelling of the same key; moved silently;
- migrated: an old key whose value becomes a new section (cpu_offload -> offload_optimizer);
- inert: a DeepSpeed key whose effect dstrain always has, or which has no effect where it is
  written; dropped with a warning in both modes;
- unsupported: a DeepSpeed feature dstrain does not implement; a warning when strict=False, an
  error when strict=True.
Keys nobody knows are typos: a warning with a "did you mean" (strict=False) or an error.
Keys that start with "_" are comments (JSON has none) and are skipped.
"""

from __future__ import annotations

import difflib
import functools
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

import attrs

from .errors import LISTED, Problem

Kind = Literal["renamed", "alias", "migrated", "inert", "unsupported"]


@attrs.frozen
class KnownKey:
    kind: Kind
    reason: str = ""
    new_key: str | None = None
    migrate: Callable[[dict, Any], None] | None = None  # (section dict, old value) -> mutates section


def _cpu_offload(section: dict, value: Any) -> None:
    pin = section.get("cpu_offload_use_pin_memory", False)
    if value is True and section.get("offload_optimizer") is None:
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}


def _cpu_offload_params(section: dict, value: Any) -> None:
    pin = section.get("cpu_offload_use_pin_memory", False)
    if value is True and section.get("offload_param") is None:
        section["offload_param"] = {"device": "cpu", "pin_memory": pin}


def _pin_memory_only(section: dict, value: Any) -> None:
    """Read by the two migrations above."""


_BF16_NO_LOSS_SCALE = "bf16 training does not scale the loss; the key has no effect"
_FP16_APEX = "apex AMP setting; dstrain's fp16 is DeepSpeed's own (use fp16.auto_cast / torch_autocast)"
_DEEPCOMPILE_KNOB = "a DeepCompile tuning knob dstrain does not implement"
_TORCH_COMPILE = "torch.compile options of older DeepSpeed; dstrain does not compile the model"
_ZERO_UNSUPPORTED = "a ZeRO variant or tuning knob dstrain does not implement"

KNOWN_KEYS: dict[tuple[str, str], KnownKey] = {
    # ---- old spellings
    ("", "bfloat16"): KnownKey("renamed", new_key="bf16"),
    ("zero_optimization", "stage3_gather_fp16_weights_on_model_save"):
        KnownKey("renamed", new_key="stage3_gather_16bit_weights_on_model_save"),
    ("zero_optimization", "gather_16bit_weights_on_model_save"):
        KnownKey("renamed", new_key="stage3_gather_16bit_weights_on_model_save"),
    ("zero_optimization", "max_live_parameters"): KnownKey("renamed", new_key="stage3_max_live_parameters"),
    ("zero_optimization", "max_reuse_distance"): KnownKey("renamed", new_key="stage3_max_reuse_distance"),
    ("zero_optimization", "prefetch_bucket_size"): KnownKey("renamed", new_key="stage3_prefetch_bucket_size"),
    ("zero_optimization", "param_persistence_threshold"):
        KnownKey("renamed", new_key="stage3_param_persistence_threshold"),
    ("zero_optimization", "module_granularity_threshold"):
        KnownKey("renamed", new_key="stage3_module_granularity_threshold"),
    ("aio", "intra_op_parallelism"): KnownKey("alias", new_key="thread_count"),
    # ---- deprecated booleans that became sections
    ("zero_optimization", "cpu_offload"): KnownKey(
        "migrated", "deprecated; use zero_optimization.offload_optimizer: {\"device\": \"cpu\"}", migrate=_cpu_offload),
    ("zero_optimization", "cpu_offload_params"): KnownKey(
        "migrated", "deprecated; use zero_optimization.offload_param: {\"device\": \"cpu\"}",
        migrate=_cpu_offload_params),
    ("zero_optimization", "cpu_offload_param"): KnownKey(  # DeepSpeed's field name (cpu_offload_params: its alias)
        "migrated", "deprecated; use zero_optimization.offload_param: {\"device\": \"cpu\"}",
        migrate=_cpu_offload_params),
    ("zero_optimization", "cpu_offload_use_pin_memory"): KnownKey(
        "migrated", "deprecated; use pin_memory inside offload_param / offload_optimizer", migrate=_pin_memory_only),
    # ---- keys whose effect dstrain always has, or that do nothing where they are
    ("", "zero_allow_untested_optimizer"): KnownKey(
        "inert", "dstrain's ZeRO works with any torch optimizer; nothing to allow"),
    ("", "zero_force_ds_cpu_optimizer"): KnownKey(
        "inert", "under optimizer offload the config's Adam/AdamW already is dstrain's CPU Adam (dszero.ops.CPUAdam); "
                 "an optimizer passed to initialize() is stepped as given"),
    ("", "disable_allgather"): KnownKey("inert", "removed from DeepSpeed long ago; it has no effect"),
    ("bf16", "loss_scale"): KnownKey("inert", _BF16_NO_LOSS_SCALE),
    ("bf16", "initial_scale_power"): KnownKey("inert", _BF16_NO_LOSS_SCALE),
    ("bf16", "loss_scale_window"): KnownKey("inert", _BF16_NO_LOSS_SCALE),
    ("bf16", "hysteresis"): KnownKey("inert", _BF16_NO_LOSS_SCALE),
    ("bf16", "consecutive_hysteresis"): KnownKey("inert", _BF16_NO_LOSS_SCALE),
    ("bf16", "min_loss_scale"): KnownKey("inert", _BF16_NO_LOSS_SCALE),
    # ---- DeepSpeed features dstrain does not implement
    ("", "sparse_attention"): KnownKey("unsupported", "sparse attention kernels are not part of dstrain"),
    ("", "compression_training"): KnownKey("unsupported", "the compression library is not part of dstrain"),
    ("", "amp"): KnownKey("unsupported", "apex AMP is not supported; use fp16, bf16 or torch_autocast"),
    ("", "quantize_training"): KnownKey("unsupported", "MoQ quantization is not part of dstrain"),
    ("", "eigenvalue"): KnownKey("unsupported", "eigenvalue computation (MoQ) is not part of dstrain"),
    ("", "progressive_layer_drop"): KnownKey("unsupported", "progressive layer dropping is not part of dstrain"),
    ("", "dynamic_train"): KnownKey(
        "unsupported", "the pre-release random-LTD section; use data_efficiency.data_routing.random_ltd"),
    ("", "sparse_gradients"): KnownKey("unsupported", "sparse gradient allreduce is not part of dstrain"),
    ("", "memory_breakdown"): KnownKey("unsupported", "per-step memory breakdown printing is not part of dstrain"),
    ("", "nebula"): KnownKey("unsupported", "Nebula checkpointing is not part of dstrain"),
    ("", "weight_quantization"): KnownKey("unsupported", "weight quantization is not part of dstrain"),
    ("fp16", "opt_level"): KnownKey("unsupported", _FP16_APEX),
    ("zero_optimization", "elastic_checkpoint"): KnownKey(
        "unsupported", "deprecated in DeepSpeed; dstrain checkpoints reshard on load without it"),
    ("zero_optimization", "zenflow"): KnownKey("unsupported", "ZenFlow is not part of dstrain"),
    ("zero_optimization", "mics_shard_size"): KnownKey("unsupported", "MiCS is not part of dstrain"),
    ("zero_optimization", "mics_hierarchical_params_gather"): KnownKey("unsupported", "MiCS is not part of dstrain"),
    ("zero_optimization", "zero_quantized_nontrainable_weights"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "stage3_model_persistence_threshold"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "model_persistence_threshold"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "memory_efficient_linear"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "pipeline_loading_checkpoint"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "override_module_apply"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "use_multi_rank_bucket_allreduce"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "legacy_stage1"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("zero_optimization", "stage3_use_all_reduce_for_fetch_params"): KnownKey("unsupported", _ZERO_UNSUPPORTED),
    ("compile", "disable"): KnownKey("unsupported", _TORCH_COMPILE),
    ("compile", "backend"): KnownKey("unsupported", _TORCH_COMPILE),
    ("compile", "kwargs"): KnownKey("unsupported", _TORCH_COMPILE),
    **{("compile", knob): KnownKey("unsupported", _DEEPCOMPILE_KNOB) for knob in (
        "symmetric_memory",)},  # NCCL symmetric memory: no such memory on gloo or the CPU
}


@attrs.define
class KeyReport:
    """What the key pass found, by kind, in the order met."""

    renamed: list[str] = attrs.Factory(list)
    inert: list[str] = attrs.Factory(list)
    unsupported: list[str] = attrs.Factory(list)
    unknown: list[str] = attrs.Factory(list)
    errors: list[Problem] = attrs.Factory(list)


@functools.cache
def nested_class(tp: Any) -> tuple[type | None, bool]:
    """(attrs class, is-a-dict-of-them) for a field type: Section, Optional[Section], dict[str, Section]."""
    origin = typing.get_origin(tp)
    if attrs.has(tp):
        return tp, False
    if origin is dict:
        _, value_type = typing.get_args(tp)
        return (value_type, True) if attrs.has(value_type) else (None, False)
    if origin is Union or type(tp).__name__ == "UnionType":
        for member in typing.get_args(tp):
            if attrs.has(member):
                return member, False
    return None, False


def accepts_none(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return (origin is Union or type(tp).__name__ == "UnionType") and type(None) in typing.get_args(tp)


def clean_keys(raw: dict, cls: type, path: str, report: KeyReport) -> dict:
    """A copy of `raw` that holds only fields of `cls`, recursively; the rest goes into `report`."""
    fields = _schema_fields(cls)
    section = dict(raw)
    section_name = path.split(".")[-1] if path else ""
    table_path = path if path.count(".") == 0 else section_name

    for key in list(section):
        if key in fields:
            continue
        known = KNOWN_KEYS.get((table_path, key))
        where = f"{path}.{key}" if path else key
        value = section.pop(key)
        if known is None:
            if not key.startswith("_"):  # "_comment"-style keys are comments
                # Suggestions (difflib) only for the keys a message lists: linear time for any number of keys.
                hint = _suggestion(key, fields, path) if len(report.unknown) < LISTED else ""
                report.unknown.append(f"{where}{hint}")
            continue
        if known.kind in ("renamed", "alias"):
            if known.new_key in section and section[known.new_key] != value:
                report.errors.append(Problem(
                    where, f"is an old name of {known.new_key}, which is also given with another value "
                           f"({section[known.new_key]!r}); keep only {known.new_key}", value))
            else:
                section.setdefault(known.new_key, value)
                if known.kind == "renamed":
                    report.renamed.append(f"{where} -> {_parent(path)}{known.new_key}")
        elif known.kind == "migrated":
            section[key] = value  # migrations read each other's values (pin memory)
            continue
        elif known.kind == "inert":
            report.inert.append(f"{where} ({known.reason})")
        else:
            report.unsupported.append(f"{where} ({known.reason})")

    for key in [k for k in section if k not in fields]:  # migrations, after every key was seen
        known = KNOWN_KEYS[(table_path, key)]
        known.migrate(section, section[key])
        report.renamed.append(f"{path}.{key} ({known.reason})")
    for key in [k for k in section if k not in fields]:
        del section[key]

    for name, field in fields.items():
        if name not in section:
            continue
        value = section[name]
        child_cls, is_mapping = nested_class(field.type)
        if child_cls is None:
            continue
        child_path = f"{path}.{name}" if path else name
        if value is None and not accepts_none(field.type):
            del section[name]  # "section": null means the defaults, as in DeepSpeed
        elif isinstance(value, dict) and is_mapping:
            section[name] = {k: clean_keys(v, child_cls, f"{child_path}.{k}", report) if isinstance(v, dict) else v
                             for k, v in value.items()}
        elif isinstance(value, dict) and not is_mapping:
            section[name] = clean_keys(value, child_cls, child_path, report)
    return section


@functools.cache
def _schema_fields(cls: type) -> dict[str, attrs.Attribute]:
    return {f.name: f for f in attrs.fields(cls) if not f.metadata.get("dsconfig_internal")}


def _parent(path: str) -> str:
    return f"{path}." if path else ""


def _all_field_paths() -> dict[str, list[str]]:
    """key name -> every dotted path where the schema has it (for 'did you mean' across sections)."""
    from .config import DeepSpeedConfig

    index: dict[str, list[str]] = {}

    def walk(cls: type, path: str) -> None:
        for field in attrs.fields(cls):
            if field.metadata.get("dsconfig_internal"):
                continue
            dotted = f"{path}.{field.name}" if path else field.name
            index.setdefault(field.name, []).append(dotted)
            child, is_mapping = nested_class(field.type)
            if child is not None:
                walk(child, f"{dotted}.<name>" if is_mapping else dotted)

    walk(DeepSpeedConfig, "")
    return index


_FIELD_PATHS: dict[str, list[str]] | None = None


def _suggestion(key: str, fields: dict, path: str) -> str:
    global _FIELD_PATHS
    names = list(fields)
    stripped = key.strip()
    if stripped != key and stripped in fields:
        return f" (did you mean '{stripped}'? the key has surrounding spaces)"
    reordered = sorted(stripped.lower().split("_"))
    for name in names:
        if sorted(name.split("_")) == reordered:
            return f" (did you mean '{name}'?)"
    close = difflib.get_close_matches(stripped.lower(), names, n=1, cutoff=0.75)
    if close:
        return f" (did you mean '{close[0]}'?)"
    if _FIELD_PATHS is None:
        _FIELD_PATHS = _all_field_paths()
    elsewhere = [p for p in _FIELD_PATHS.get(stripped, []) if p.rsplit(".", 1)[0] != path]
    if elsewhere:
        return f" (it belongs at {elsewhere[0]})"
    close = difflib.get_close_matches(stripped.lower(), names, n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{close[0]}'?)"
    return ""


# Keys of the schema whose value asks for something dstrain does not do: path -> (does the value ask?, why).
# Refused like the unsupported keys above (requested_unsupported; load's strict mode), warned otherwise.
UNSUPPORTED_VALUES: dict[tuple[str, ...], tuple[Callable[[Any], bool], str]] = {
    ("zero_optimization", "offload_optimizer", "ratio"): (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v < 1,
        "partial optimizer offload (a ratio below 1) is not implemented: every offloaded optimizer step runs on "
        "the CPU"),
    ("zero_optimization", "parameter_alignment"): (
        lambda v: v is True, "ZeRO's flat buffers keep parameters back to back, without 16-byte alignment padding"),
    ("aio", "use_gds"): (lambda v: v is True, "GPUDirect Storage is not part of dsaio"),
}


def value_requests(raw: dict) -> list[tuple[str, str, Any]]:
    """(path, why, value) of every UNSUPPORTED_VALUES key whose value in `raw` asks for the missing thing."""
    found = []
    for path, (asks, why) in UNSUPPORTED_VALUES.items():
        holder: Any = raw
        for part in path[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and path[-1] in holder and asks(holder[path[-1]]):
            found.append((".".join(path), why, holder[path[-1]]))
    return found


# Unsupported keys that ask for nothing missing: elastic_checkpoint's effect (resharding on load) is
# always there, and the old torch.compile options only configure an engine.compile() call the script makes.
_NOT_FEATURE_REQUESTS = frozenset({("zero_optimization", "elastic_checkpoint"), ("compile", "disable"),
                                   ("compile", "backend"), ("compile", "kwargs")})


def requested_unsupported(raw: dict) -> list[Problem]:
    """The unsupported keys of `raw` whose value asks for the feature (not false, null, empty or enabled: false).

    A loader may ignore unsupported keys with a warning; an engine must refuse the ones that turn
    a feature on, since training without it would silently differ from what the config says.
    """
    problems = []
    for (section, key), known in KNOWN_KEYS.items():
        if known.kind != "unsupported" or (section, key) in _NOT_FEATURE_REQUESTS:
            continue
        holder = raw if section == "" else raw.get(section)
        if not isinstance(holder, dict) or key not in holder or not _is_request(holder[key]):
            continue
        path = f"{section}.{key}" if section else key
        problems.append(Problem(path, f"asks for a feature dstrain does not provide ({known.reason}); remove "
                                      f"the key or turn it off", holder[key]))
    for path, why, value in value_requests(raw):
        problems.append(Problem(path, f"asks for something dstrain does not do ({why}); remove the key or set it "
                                      f"to its default", value))
    return problems


def _is_request(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value) and value.get("enabled", True) not in (False, "false")
    return value not in (None, False, 0, -1, "", [])  # -1: DeepSpeed's "off" for sizes (mics_shard_size)
