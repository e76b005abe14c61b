"""Refuse, at initialize(), a config that turns on a feature no installed dstrain library provides.

Training on without it would silently differ from what the config asks for, so each such key is an
error that names it. A library says which config features it provides with entry points in the
group "dstrain.features" (name: the config path, value: the providing module), e.g. in dsmoe's
pyproject.toml:

    [project.entry-points."dstrain.features"]
    "expert_parallel.enabled" = "dsmoe"

so installing a library lifts its own gate. The facade keeps the table of gated features below. Where
a library is installed but this version's engine does not compose its feature yet, the feature is
refused naming that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from typing import Any

import dsconfig
from dsconfig import DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError

FEATURE_GROUP = "dstrain.features"


@dataclass(frozen=True)
class GatedFeature:
    name: str  # the entry-point name a providing library declares: the config path of the feature
    key: str  # the key that turns it on, named in the error
    what: str
    library: str  # the distribution that provides it: `pip install <library>`
    value: Callable[[DeepSpeedConfig], Any]  # the key's value; the feature is on when it is truthy

    def is_on(self, cfg: DeepSpeedConfig) -> bool:
        return bool(self.value(cfg))


def _pipeline_stages(cfg: DeepSpeedConfig) -> int:
    stages = cfg.pipeline.stages
    return stages if isinstance(stages, int) and stages > 1 else 0  # "auto": the model decides, none here


def _autotp_size(cfg: DeepSpeedConfig) -> int:
    return cfg.tensor_parallel.autotp_size if cfg.tensor_parallel.autotp_size > 1 else 0


def _data_efficiency(cfg: DeepSpeedConfig) -> bool:
    # DeepSpeed runs curriculum learning and random-LTD from their own keys, whatever data_efficiency.enabled says.
    de = cfg.data_efficiency
    return de.enabled or de.data_sampling.curriculum_learning.enabled or de.data_routing.random_ltd.enabled


GATED_FEATURES = (
    GatedFeature("pipeline", "pipeline.stages", "pipeline parallelism", "dspipe", _pipeline_stages),
    GatedFeature("tensor_parallel.autotp_size", "tensor_parallel.autotp_size", "AutoTP tensor parallelism", "dstp",
                 _autotp_size),
    GatedFeature("expert_parallel.enabled", "expert_parallel.enabled", "AutoEP expert parallelism", "dsmoe",
                 lambda cfg: cfg.expert_parallel.enabled),
    GatedFeature("data_efficiency.enabled", "data_efficiency.enabled",
                 "data efficiency (curriculum learning, random-LTD)", "dsdata", _data_efficiency),
    GatedFeature("curriculum_learning.enabled", "curriculum_learning.enabled", "the legacy seqlen curriculum",
                 "dsdata", lambda cfg: cfg.curriculum_learning.enabled),
    GatedFeature("sequence_parallel_size", "sequence_parallel_size", "Ulysses sequence parallelism", "dsseq",
                 lambda cfg: cfg.sequence_parallel_size if cfg.sequence_parallel_size > 1 else 0),
    GatedFeature("compile.deepcompile", "compile.deepcompile", "DeepCompile", "dscompile",
                 lambda cfg: cfg.compile.deepcompile),
)

# Gated features whose library, once installed, this version's engine also composes into training.
ENGINE_COMPOSES: frozenset[str] = frozenset({"tensor_parallel.autotp_size", "data_efficiency.enabled",
                                             "curriculum_learning.enabled", "pipeline", "expert_parallel.enabled",
                                             "sequence_parallel_size", "compile.deepcompile"})


def provided_features(declared: Iterable[EntryPoint] | None = None) -> dict[str, str]:
    """{feature name: providing module} from the "dstrain.features" entry points of the installed
    distributions, or of `declared` (entry points of other groups are ignored)."""
    if declared is None:
        declared = entry_points(group=FEATURE_GROUP)
    return {point.name: point.value for point in declared if point.group == FEATURE_GROUP}


def _installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def check_features(cfg: DeepSpeedConfig, raw: dict | None, provided: Mapping[str, str] | None = None,
                   installed: Callable[[str], bool] = _installed) -> None:
    """Raise UnsupportedFeatureError listing every key that turns on what no installed library
    provides (`provided`: feature name -> module, default: what is installed; `installed(name)`:
    whether a distribution is installed, to tell "pip install it" from "this version lacks it")."""
    if provided is None:
        provided = provided_features()
    problems: list[Problem] = list(dsconfig.requested_unsupported(raw)) if raw is not None else []
    for feature in GATED_FEATURES:
        if not feature.is_on(cfg):
            continue
        if feature.name not in provided:
            if installed(feature.library):
                reason = (f"the installed {feature.library} does not provide it (a newer {feature.library} may); "
                          f"remove the key or turn it off")
            else:
                reason = (f"which needs the {feature.library} library: `pip install {feature.library}`, or remove "
                          f"the key or turn it off")
            problems.append(Problem(feature.key, f"turns on {feature.what}, {reason}", feature.value(cfg)))
        elif feature.name not in ENGINE_COMPOSES:
            problems.append(Problem(feature.key, f"turns on {feature.what}: {provided[feature.name]} provides it, "
                                                 f"but this dstrain's engine does not compose it yet; remove the "
                                                 f"key or turn it off", feature.value(cfg)))
    if problems:
        raise UnsupportedFeatureError(problems)
