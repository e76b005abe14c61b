"""Elastic batch sizes: DeepSpeed's `elasticity` arithmetic, a pure function of the section and the world size.

    final_batch, valid_gpus = dsconfig.compute_elastic_config(ds_config)
    final_batch, valid_gpus, micro_batch = dsconfig.compute_elastic_config(ds_config, world_size=64)

Given the largest acceptable global batch and the micro-batch sizes a job may use, it picks the global batch that
the most GPU counts in [min_gpus, max_gpus] divide into a whole number of micro-batches (gradient accumulation
takes up the rest), so a scheduler can grow or shrink the job across those counts without changing convergence.
Version 0.1 counts GPUs; version 0.2 counts nodes of `num_gpus_per_node` GPUs holding `model_parallel_size`-wide
model replicas, and needs the running world size. Reads nothing from the environment: the caller passes the
world size (dstrain's `deepspeed.elasticity` reads `WORLD_SIZE` as DeepSpeed does).
"""

from __future__ import annotations

import math
import re
from functools import reduce
from typing import Any

import attrs

from .errors import ConfigError, Problem

LATEST_ELASTICITY_VERSION = 0.2
MINIMUM_DEEPSPEED_VERSION = "0.3.8"  # the first DeepSpeed release with elasticity
DEEPSPEED_ELASTICITY_CONFIG = "DEEPSPEED_ELASTICITY_CONFIG"  # the scheduler's copy of the section (an env var)

# Highly composite numbers: each has more divisors than any smaller number, so a batch size that is one of them
# times a micro-batch divides among the most GPU counts. Enough for global batches up to ~720K.
HCN_LIST = (1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560, 10080, 15120,
            20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760, 277200, 332640, 498960, 554400,
            665280, 720720)


class ElasticityError(ConfigError):
    """An elastic config that cannot be used (DeepSpeed's `deepspeed.elasticity.config.ElasticityError`)."""


class ElasticityConfigError(ElasticityError):
    """A problem in the `elasticity` section itself."""


class ElasticityIncompatibleWorldSize(ElasticityError):
    """A world size that is not one of the GPU counts the elastic config allows."""


@attrs.frozen
class ElasticityConfig:
    """The `elasticity` section, validated. DeepSpeed's attribute names are properties."""

    enabled: bool = False
    max_train_batch_size: int = 2000
    micro_batch_sizes: tuple[int, ...] = (2, 4, 6)
    min_gpus: int = 1
    max_gpus: int = 10000
    min_time: float = 0
    version: float = LATEST_ELASTICITY_VERSION
    prefer_larger_batch: bool = True
    ignore_non_elastic_batch_info: bool = False
    model_parallel_size: int = 1
    num_gpus_per_node: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON data (what `read_elasticity` reads back)."""
        return {**attrs.asdict(self), "micro_batch_sizes": list(self.micro_batch_sizes)}

    @property
    def max_acceptable_batch_size(self) -> int:
        return self.max_train_batch_size

    @property
    def micro_batches(self) -> list[int]:
        return list(self.micro_batch_sizes)

    @property
    def prefer_larger_batch_size(self) -> bool:
        return self.prefer_larger_batch


_INT_KEYS = ("max_train_batch_size", "min_gpus", "max_gpus", "model_parallel_size", "num_gpus_per_node")
_BOOL_KEYS = ("enabled", "prefer_larger_batch", "ignore_non_elastic_batch_info")
_KEYS = frozenset(a.name for a in attrs.fields(ElasticityConfig))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _version_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def read_elasticity(section: Any, path: str = "elasticity") -> ElasticityConfig:
    """The `elasticity` section as an ElasticityConfig; every problem at once in an ElasticityConfigError.
    When enabled, `max_train_batch_size` and `micro_batch_sizes` are required (DeepSpeed's rule)."""
    if not isinstance(section, dict):
        raise ElasticityConfigError(Problem(path, "must be a mapping of the elasticity keys", section))
    problems = [Problem(f"{path}.{key}", f"is not an elasticity key; valid keys: {', '.join(sorted(_KEYS))}")
                for key in section if key not in _KEYS]
    values = {key: section[key] for key in section if key in _KEYS}
    for key in _BOOL_KEYS:
        if key in values and not isinstance(values[key], bool):
            problems.append(Problem(f"{path}.{key}", "must be true or false", values[key]))
    if values.get("enabled") is True:
        problems += [Problem(f"{path}.{key}", "is required when elasticity is enabled")
                     for key in ("max_train_batch_size", "micro_batch_sizes") if key not in values]
    for key in _INT_KEYS:
        if key in values and (not _is_int(values[key]) or values[key] < 1):
            problems.append(Problem(f"{path}.{key}", "must be a positive integer", values[key]))
    micro = values.get("micro_batch_sizes", [2, 4, 6])
    if isinstance(micro, tuple):  # a loaded config's own section (DeepSpeedConfig.to_dict)
        micro = list(micro)
    if not isinstance(micro, list) or not micro or not all(_is_int(m) and m > 0 for m in micro):
        problems.append(Problem(f"{path}.micro_batch_sizes", "must be a non-empty list of positive integers", micro))
        micro = [1]
    if "min_time" in values and (isinstance(values["min_time"], bool) or not isinstance(values["min_time"], (int, float))
                                 or values["min_time"] < 0):
        problems.append(Problem(f"{path}.min_time", "must be a number >= 0 (minutes)", values["min_time"]))
    version = _version_number(values.get("version", LATEST_ELASTICITY_VERSION))
    if version is None:
        problems.append(Problem(f"{path}.version", "must be an elasticity version number (0.1 or 0.2)",
                                values.get("version")))
    elif version not in (0.1, 0.2):
        newer = f"; this runtime supports up to {LATEST_ELASTICITY_VERSION}" if version > LATEST_ELASTICITY_VERSION else ""
        problems.append(Problem(f"{path}.version", f"must be 0.1 or 0.2{newer}", values.get("version")))
    if not problems:
        config = ElasticityConfig(**{**values, "micro_batch_sizes": tuple(micro), "version": version})
        if config.max_gpus < config.min_gpus:
            problems.append(Problem(f"{path}.min_gpus", f"must not exceed max_gpus ({config.max_gpus})", config.min_gpus))
        if config.model_parallel_size > 1 and config.version != 0.2:
            problems.append(Problem(f"{path}.model_parallel_size", "needs elasticity version 0.2 (version 0.1 does not "
                                    "support model parallelism)", config.model_parallel_size))
        too_big = [m for m in config.micro_batch_sizes if m > config.max_train_batch_size]
        if too_big:
            problems.append(Problem(f"{path}.micro_batch_sizes", f"{too_big} exceed max_train_batch_size "
                                    f"({config.max_train_batch_size}): every micro batch must fit in it", micro))
        if not problems:
            return config
    raise ElasticityConfigError(problems)


def _version_tuple(text: str) -> tuple[int, ...] | None:
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def check_deepspeed_version(target: str) -> None:
    """Refuse a target DeepSpeed version older than the first with elasticity (0.3.8)."""
    parsed, minimum = _version_tuple(target), _version_tuple(MINIMUM_DEEPSPEED_VERSION)
    if parsed is None:
        raise ElasticityError(Problem("target_deepspeed_version", "is not a version number", target))
    width = max(len(parsed), len(minimum))
    if parsed + (0,) * (width - len(parsed)) < minimum + (0,) * (width - len(minimum)):
        raise ElasticityError(Problem("target_deepspeed_version", f"is older than {MINIMUM_DEEPSPEED_VERSION}, the "
                                      "first DeepSpeed version with elasticity", target))


def candidate_batch_sizes(bases: list[int], max_batch: int) -> list[int]:
    """Each base scaled by the largest highly composite number that keeps it within `max_batch` (bases beyond
    `max_batch` are left out: scaling only grows them)."""
    found = set()
    for base in bases:
        if base > max_batch:
            continue
        fitting = [hcn for hcn in HCN_LIST if hcn * base <= max_batch]
        found.add(fitting[-1] * base)
    return sorted(found)


def valid_gpu_counts(batch: int, micro_batches: list[int], min_gpus: int, max_gpus: int) -> list[int]:
    """The GPU counts in [min_gpus, max_gpus] among which `batch` splits into whole micro-batches of one size."""
    counts = set()
    for micro in micro_batches:
        if batch % micro:
            continue
        replicas = batch // micro  # micro-batches per step: any divisor of it is a GPU count
        counts.update(n for n in range(max(min_gpus, 1), min(max_gpus, replicas) + 1) if replicas % n == 0)
    return sorted(counts)


def best_batch(micro_batches: list[int], max_batch: int, min_gpus: int | None, max_gpus: int | None,
               prefer_larger: bool) -> tuple[int, list[int]]:
    """Version 0.1: the candidate batch with the most valid GPU counts (ties: the larger, or smaller, batch)."""
    min_gpus = min_gpus or 1
    max_gpus = max_gpus or max_batch // min(micro_batches)
    bases = [*micro_batches, reduce(math.lcm, micro_batches)]
    chosen, chosen_counts = min(micro_batches), []
    for batch in candidate_batch_sizes(bases, max_batch):
        counts = valid_gpu_counts(batch, micro_batches, min_gpus, max_gpus)
        better_tie = batch > chosen if prefer_larger else batch < chosen
        if len(counts) > len(chosen_counts) or (len(counts) == len(chosen_counts) and better_tie):
            chosen, chosen_counts = batch, counts
    return int(chosen), chosen_counts


def _micro_for(batch: int, gpus: int, micro_batches: list[int], prefer_larger: bool) -> int | None:
    fitting = [m for m in micro_batches if gpus and (batch // gpus) % m == 0]
    if not fitting:
        return None
    return max(fitting) if prefer_larger else fitting[0]


def _node_level(config: ElasticityConfig, running_gpus: int) -> tuple[int, list[int], int | None]:
    """Version 0.2: version 0.1's search over nodes, each holding num_gpus_per_node // model_parallel_size
    data-parallel replicas; a running world size outside the result gets the batch that fits it instead."""
    per_node, mp = config.num_gpus_per_node, config.model_parallel_size
    if per_node % mp:
        raise ElasticityConfigError(Problem("elasticity.num_gpus_per_node", f"must be divisible by "
                                            f"model_parallel_size ({mp}) in elasticity version 0.2", per_node))
    replicas_per_node = per_node // mp
    micro = config.micro_batches
    batch, nodes = best_batch(micro, int(config.max_train_batch_size / replicas_per_node),
                              int(config.min_gpus / per_node), int(config.max_gpus / per_node),
                              config.prefer_larger_batch)
    batch *= replicas_per_node
    valid = [n * replicas_per_node for n in nodes]
    # The micro batch divides the batch of one data-parallel replica (DeepSpeed divides by all GPUs, which under
    # model parallelism can name a micro batch that does not divide a replica's share).
    running_replicas = running_gpus // mp
    if running_replicas in valid:
        return batch, valid, _micro_for(batch, running_replicas, micro, config.prefer_larger_batch)
    replicas = running_gpus / per_node * replicas_per_node
    fits = [math.floor(config.max_train_batch_size / (m * replicas)) * m * replicas for m in micro]
    batch = int(max(fits) if config.prefer_larger_batch else min(fits))
    return batch, [int(replicas)], _micro_for(batch, int(replicas), micro, config.prefer_larger_batch)


def compute_elastic_config(ds_config: dict, target_deepspeed_version: str | None = None, world_size: int = 0,
                           return_microbatch: bool = False, *, running_world_size: int | None = None):
    """DeepSpeed's `compute_elastic_config`: (final_batch_size, valid_gpus), or with `world_size` (or
    `return_microbatch`) also the micro-batch size to run at. `world_size` > 0 must be one of valid_gpus
    (ElasticityIncompatibleWorldSize otherwise). Version 0.2 needs the running world size: `world_size`, else
    `running_world_size`. `target_deepspeed_version` (optional) must be at least 0.3.8."""
    if not isinstance(ds_config, dict):
        raise ElasticityConfigError(Problem("<config>", "must be a dict holding an 'elasticity' section", ds_config))
    if "elasticity" not in ds_config:
        raise ElasticityConfigError(Problem("elasticity", "is missing: an elastic job needs the elasticity section"))
    section = ds_config["elasticity"]
    if not isinstance(section, dict) or section.get("enabled", False) is not True:
        raise ElasticityConfigError(Problem("elasticity.enabled", "must be true to compute an elastic config",
                                            section.get("enabled", False) if isinstance(section, dict) else section))
    config = read_elasticity(section)
    if target_deepspeed_version is not None:
        check_deepspeed_version(target_deepspeed_version)
    if _is_int(world_size) is False or world_size < 0:
        raise ElasticityError(Problem("world_size", "must be an integer >= 0 (0: not given)", world_size))
    micro = None
    if config.version == 0.1:
        batch, valid = best_batch(config.micro_batches, config.max_train_batch_size, config.min_gpus,
                                  config.max_gpus, config.prefer_larger_batch)
    else:
        running = world_size or running_world_size
        if not running or not _is_int(running) or running < 1:
            raise ElasticityConfigError(Problem("world_size", "elasticity version 0.2 needs the running world size: "
                                                "pass world_size (or set WORLD_SIZE)", running))
        batch, valid, micro = _node_level(config, running)
    if world_size > 0:
        if world_size not in valid:
            raise ElasticityIncompatibleWorldSize(Problem("world_size", f"is not one of the GPU counts this elastic "
                                                          f"config allows: {valid}", world_size))
        return batch, valid, _largest_micro(batch, world_size, config)
    if return_microbatch:
        if config.version == 0.2:
            return batch, valid, micro
        raise ElasticityConfigError(Problem("world_size", "return_microbatch needs the world size to pick a micro "
                                            "batch for (elasticity version 0.1)", world_size))
    return batch, valid


def _largest_micro(batch: int, world_size: int, config: ElasticityConfig) -> int:
    micro = _micro_for(batch, world_size, sorted(set(config.micro_batches)), prefer_larger=True)
    if micro is None:
        raise ElasticityIncompatibleWorldSize(Problem("world_size", f"no micro batch of {config.micro_batches} "
                                                      f"divides {batch // world_size}, the batch per GPU", world_size))
    return micro


@attrs.frozen
class ElasticBatch:
    """The batch an elastic job runs at one data-parallel size: train_batch_size = micro x accumulation x size."""

    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    valid_world_sizes: tuple[int, ...]  # the data-parallel sizes this elastic config can run at

    def triple(self) -> dict[str, int]:
        return {"train_batch_size": self.train_batch_size,
                "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
                "gradient_accumulation_steps": self.gradient_accumulation_steps}


def elastic_batch(config: ElasticityConfig, data_parallel_size: int) -> ElasticBatch:
    """The batch triple an enabled elastic config gives a job of `data_parallel_size` model replicas: the global
    batch the most sizes share, the largest listed micro batch that divides a replica's share, accumulation for
    the rest (DeepSpeed's runtime rule). A size the config cannot run at is ElasticityIncompatibleWorldSize."""
    dp = data_parallel_size
    if config.version == 0.1:
        batch, valid = best_batch(config.micro_batches, config.max_train_batch_size, config.min_gpus,
                                  config.max_gpus, config.prefer_larger_batch)
        micro = _largest_micro(batch, dp, config) if dp in valid else None
    else:  # version 0.2 counts GPUs: each replica is model_parallel_size wide
        batch, valid, micro = _node_level(config, dp * config.model_parallel_size)
    if micro is None or batch % (micro * dp):
        raise ElasticityIncompatibleWorldSize(Problem(
            "elasticity", f"a data-parallel size of {dp} is not one this elastic config can run at (global batch "
                          f"{batch}, micro batches {config.micro_batches}); valid sizes: {valid}", dp))
    return ElasticBatch(batch, micro, batch // (micro * dp), tuple(valid))


def elasticity_enabled(ds_config: dict) -> bool:
    """Whether the config turns elasticity on."""
    section = ds_config.get("elasticity") if isinstance(ds_config, dict) else None
    return isinstance(section, dict) and section.get("enabled", False) is True


def check_same_elastic_config(runtime_section: dict, scheduler_section: dict) -> None:
    """DeepSpeed's `ensure_immutable_elastic_config`: the resource scheduler's copy of the section (the
    DEEPSPEED_ELASTICITY_CONFIG variable) must agree with the runtime's on the batch, micro-batches and version."""
    runtime, scheduler = read_elasticity(runtime_section), read_elasticity(scheduler_section, DEEPSPEED_ELASTICITY_CONFIG)
    problems = [Problem(f"elasticity.{key}", f"differs from the resource scheduler's "
                        f"{DEEPSPEED_ELASTICITY_CONFIG} ({getattr(scheduler, key)!r})", getattr(runtime, key))
                for key in ("max_train_batch_size", "micro_batch_sizes", "version")
                if getattr(runtime, key) != getattr(scheduler, key)]
    if problems:
        raise ElasticityConfigError(problems)
