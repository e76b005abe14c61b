"""`load()`: source -> keys checked -> types structured -> bounds -> batch triple -> cross-field rules.

Every stage collects all its problems; the first stage that found any raises them together.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import attrs

from .batch import resolve_batch_triple
from .config import BATCH_KEYS, DeepSpeedConfig
from .converter import CONVERTER, problems_from
from .elasticity import (
    ElasticityConfig,
    ElasticityConfigError,
    ElasticityError,
    elastic_batch,
    read_elasticity,
)
from .errors import ConfigError, ConfigWarning, Problem, listing
from .fields import AUTO, info
from .jsonio import read_source
from .keys import KeyReport, clean_keys, nested_class, value_requests
from .params import (
    DEEPSPEED_ONLY_OPTIMIZERS,
    DSTRAIN_OPTIMIZERS,
    DSTRAIN_SCHEDULERS,
    OPTIMIZER_BOUNDS,
    OPTIMIZER_PARAMS,
    PARAM_BOUNDS,
    SCHEDULER_PARAMS,
    TORCH_OPTIMIZERS,
    TORCH_SCHEDULERS,
    canonical_name,
    check_bounds,
    check_params,
)
from .rules import check_rules


def load(source: Any, *, world_size: int = 1, strict: bool = True) -> DeepSpeedConfig:
    """Load and validate a DeepSpeed config.

    source: a path to a JSON file, a dict, or a base64-encoded JSON string.
    world_size: the data-parallel size the batch triple is resolved at.
    strict: unknown and unsupported keys are errors (True) or warnings (False). Invalid values
        are errors either way.
    """
    raw, name = read_source(source)
    try:
        return _load_dict(raw, world_size=world_size, strict=strict)
    except ConfigError as exc:
        if name and not exc.source:
            raise ConfigError(exc.problems, source=name) from None
        raise


def _load_dict(raw: dict, *, world_size: int, strict: bool) -> DeepSpeedConfig:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(Problem("world_size", "must be a positive integer", world_size))
    raw, elastic, problems, elastic_error = _take_elasticity(raw, world_size)
    report = KeyReport()
    cleaned = clean_keys(raw, DeepSpeedConfig, "", report)
    report.unsupported += [f"{path} ({why})" for path, why, _ in value_requests(cleaned)]
    problems += report.errors
    problems += _check_names_and_params(cleaned, report)

    try:
        cfg = CONVERTER.structure(cleaned, DeepSpeedConfig)
    except Exception as exc:
        problems += problems_from(exc, "")
        cfg = None
    if cfg is not None:
        problems += _check_bounds(cfg, "")

    # The batch triple is checked even when other keys failed, so one run reports both.
    triple, batch_problems = _batch_triple(cleaned, world_size, [p.path for p in problems])
    problems += batch_problems
    _report_keys(report, strict, problems)
    if problems:
        raise elastic_error(problems)
    cfg = attrs.evolve(cfg, data_parallel_size=world_size, elasticity=elastic, **triple)
    return _apply_rules(cfg, strict)


def _take_elasticity(raw: dict, world_size: int) -> tuple[dict, ElasticityConfig, list[Problem], type[ConfigError]]:
    """`raw` without its `elasticity` section and, when that is enabled, with the batch triple elasticity picks at
    `world_size` (DeepSpeed's runtime rule); the section, its problems, and the error class to raise them as
    (an ElasticityError where the section has problems, so `deepspeed.elasticity`'s except clauses catch it).
    Batch keys that differ from elasticity's are an error unless `ignore_non_elastic_batch_info` (then a warning)."""
    if "elasticity" not in raw:
        return raw, ElasticityConfig(), [], ConfigError
    raw = dict(raw)
    section = raw.pop("elasticity")
    try:
        elastic = read_elasticity(section)
        if not elastic.enabled:
            return raw, elastic, [], ConfigError
        picked = elastic_batch(elastic, world_size).triple()
    except ElasticityError as exc:
        return raw, ElasticityConfig(), list(exc.problems), type(exc)
    differing = {key: raw[key] for key in BATCH_KEYS if key in raw and raw[key] != AUTO and raw[key] != picked[key]}
    if differing and not elastic.ignore_non_elastic_batch_info:
        return raw, elastic, [Problem(key, f"elasticity is enabled and picks {key} = {picked[key]} at data-parallel "
                                           f"size {world_size}; remove {key}, or set "
                                           f"elasticity.ignore_non_elastic_batch_info: true to have it ignored", value)
                              for key, value in differing.items()], ElasticityConfigError
    if differing:
        warnings.warn(ConfigWarning("batch sizes replaced by the ones elasticity picks (ignore_non_elastic_batch_info): "
                                    + listing([f"{key} = {value} -> {picked[key]}" for key, value in differing.items()])),
                      stacklevel=5)
    raw.update(picked)
    return raw, elastic, [], ConfigError


def load_section(name: str, raw: Any, *, strict: bool = True) -> Any:
    """Load one top-level section (`"zero_optimization"`, `"tensorboard"`, ...) on its own, as `load` reads it
    inside a whole config: old key names migrated, types structured, bounds checked. The cross-section rules
    (which need the rest of a config) do not run. An unknown section name is a ConfigError naming it."""
    fields = {f.name: f for f in attrs.fields(DeepSpeedConfig)}
    section_cls, is_mapping = nested_class(fields[name].type) if name in fields else (None, False)
    if section_cls is None or is_mapping:
        raise ConfigError(Problem(name, "is not a section of the DeepSpeed config", name))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(Problem(name, "must be a mapping", raw))
    report = KeyReport()
    cleaned = clean_keys({name: raw}, DeepSpeedConfig, "", report)
    problems = list(report.errors)
    value = None
    try:
        value = CONVERTER.structure(cleaned.get(name, {}), section_cls)
    except Exception as exc:
        problems += problems_from(exc, name)
    if value is not None:
        problems += _check_bounds(value, name)
    _report_keys(report, strict, problems)
    if problems:
        raise ConfigError(problems)
    return value


def _batch_triple(cleaned: dict, world_size: int, failed: list[str]) -> tuple[dict, list[Problem]]:
    if any(key in failed for key in BATCH_KEYS):
        return {}, []
    known = {key: int(cleaned[key]) for key in BATCH_KEYS
             if isinstance(cleaned.get(key), (int, float)) and not isinstance(cleaned[key], bool)}
    if any(value < 1 for value in known.values()):
        return {}, []  # reported by the bounds check
    explicit_auto = [key for key in BATCH_KEYS if cleaned.get(key) == AUTO]
    try:
        return resolve_batch_triple(known, explicit_auto=explicit_auto, data_parallel_size=world_size), []
    except ConfigError as exc:
        return {}, exc.problems


def _apply_rules(cfg: DeepSpeedConfig, strict: bool) -> DeepSpeedConfig:
    findings = check_rules(cfg)
    errors = [f.problem for f in findings if not f.inert and not f.warn_only]
    errors += [f.problem for f in findings if f.inert and strict]
    if errors:
        raise ConfigError(errors)
    notes = [f for f in findings if f.warn_only or f.inert]
    for finding in notes:
        if finding.neutralize is not None:
            cfg = finding.neutralize(cfg)
    if notes:
        warnings.warn(ConfigWarning("settings with no effect where they are written (ignored): "
                                    + listing([str(f.problem) for f in notes])), stacklevel=4)
    return cfg


def _report_keys(report: KeyReport, strict: bool, problems: list[Problem]) -> None:
    if report.renamed:
        warnings.warn(ConfigWarning("old key names, read as their current names (update the config): "
                                    + listing(report.renamed)), stacklevel=4)
    if report.inert:
        warnings.warn(ConfigWarning("keys that have no effect in dstrain (ignored): " + listing(report.inert)),
                      stacklevel=4)
    if strict:
        problems += [Problem(_path_of(entry), f"is not supported by dstrain{_reason_of(entry)}; remove it, "
                                              f"or load with strict=False to ignore it")
                     for entry in report.unsupported]
        problems += [Problem(_path_of(entry), f"unknown key{_reason_of(entry)}; remove it or fix its "
                                              f"spelling (strict=False ignores it with a warning)")
                     for entry in report.unknown]
        return
    if report.unsupported:
        warnings.warn(ConfigWarning("DeepSpeed features dstrain does not implement (ignored): "
                                    + listing(report.unsupported)), stacklevel=4)
    if report.unknown:
        warnings.warn(ConfigWarning("unknown keys (ignored): " + listing(report.unknown)), stacklevel=4)


def _path_of(entry: str) -> str:
    return entry.split(" (", 1)[0]


def _reason_of(entry: str) -> str:
    """The parenthesised part of a report entry, with its parentheses."""
    return " (" + entry.split(" (", 1)[1] if " (" in entry else ""


def _check_names_and_params(cleaned: dict, report: KeyReport) -> list[Problem]:
    """Canonicalise optimizer / scheduler names in place and check the params dstrain builds."""
    problems: list[Problem] = []
    for key, own, others, tables in (
        ("optimizer", DSTRAIN_OPTIMIZERS, TORCH_OPTIMIZERS, OPTIMIZER_PARAMS),
        ("scheduler", DSTRAIN_SCHEDULERS, TORCH_SCHEDULERS, SCHEDULER_PARAMS),
    ):
        section = cleaned.get(key)
        if not isinstance(section, dict) or not isinstance(section.get("type"), str):
            continue
        name = section["type"]
        canonical = canonical_name(name, own, others)
        if canonical is None and key == "optimizer":
            unsupported = canonical_name(name, DEEPSPEED_ONLY_OPTIMIZERS)
            if unsupported is not None:
                report.unsupported.append(
                    f"{key}.type ({unsupported} is a DeepSpeed optimizer dstrain does not implement; use "
                    f"{', '.join(DSTRAIN_OPTIMIZERS)} or pass your own optimizer to initialize())")
                section["type"] = unsupported
                continue
        if canonical is None:
            import difflib

            choices = [*own, *others]
            close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(Problem(f"{key}.type", f"is not a known {key}; {hint}valid: {', '.join(own)}, "
                                                   f"or a torch class name ({', '.join(others[:6])}, ...)", name))
            continue
        section["type"] = canonical
        params = section.get("params")
        if canonical in tables and isinstance(params, dict):
            problems += check_params(f"{key}.params", params, tables[canonical], report.unknown, PARAM_BOUNDS[key])
        elif key == "optimizer" and isinstance(params, dict):  # a torch optimizer: the ranges torch checks too
            problems += check_bounds(f"{key}.params", params, OPTIMIZER_BOUNDS)
    return problems


def _check_bounds(obj: Any, path: str) -> list[Problem]:
    """Numeric bounds declared on the fields (ge / gt / le), recursively."""
    problems: list[Problem] = []
    for name, child, is_mapping, meta in _bounds_plan(type(obj)):
        value = getattr(obj, name)
        where = f"{path}.{name}" if path else name
        if child is not None:
            if value is not None:
                for key, item in (value.items() if is_mapping else [("", value)]):
                    problems += _check_bounds(item, f"{where}.{key}" if is_mapping else where)
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if meta.ge is not None and item < meta.ge:
                problems.append(Problem(where, f"must be >= {meta.ge:g}", item))
            elif meta.gt is not None and item <= meta.gt:
                problems.append(Problem(where, f"must be > {meta.gt:g}", item))
            elif meta.le is not None and item > meta.le:
                problems.append(Problem(where, f"must be <= {meta.le:g}", item))
    return problems


@functools.cache
def _bounds_plan(cls: type) -> tuple:
    """The fields of `cls` worth visiting: nested sections, and values with declared bounds."""
    plan = []
    for field in attrs.fields(cls):
        child, is_mapping = nested_class(field.type)
        meta = info(field)
        if child is not None or (meta.ge, meta.gt, meta.le) != (None, None, None):
            plan.append((field.name, child, is_mapping, meta))
    return tuple(plan)
