"""Refuse, at initialize(), a config that turns on a feature no installed dstrain library provides.

Training on without it would silently differ from what the config asks for, so each such key is
an error that names it.
"""

from __future__ import annotations

import dsconfig
from dsconfig import DeepSpeedConfig, Problem

from .errors import UnsupportedFeatureError


def _not_built(what: str, lib: str) -> str:
    return f"turns on {what}, which needs the {lib} library (not part of this dstrain yet); remove it or turn it off"


def check_features(cfg: DeepSpeedConfig, raw: dict | None) -> None:
    problems: list[Problem] = list(dsconfig.requested_unsupported(raw)) if raw is not None else []
    if cfg.tensor_parallel.autotp_size > 1:
        problems.append(Problem("tensor_parallel.autotp_size", _not_built("AutoTP tensor parallelism", "dstrain TP"),
                                cfg.tensor_parallel.autotp_size))
    if cfg.expert_parallel.enabled:
        problems.append(Problem("expert_parallel.enabled", _not_built("AutoEP expert parallelism", "dsmoe"), True))
    if cfg.data_efficiency.enabled:
        problems.append(Problem("data_efficiency.enabled", _not_built("data efficiency (curriculum learning, "
                                                                      "random-LTD)", "dsdata"), True))
    for path, on, what in (("hybrid_engine.enabled", cfg.hybrid_engine.enabled, "the hybrid engine"),
                           ("autotuning.enabled", cfg.autotuning.enabled, "the autotuner"),
                           ("compile.deepcompile", cfg.compile.deepcompile, "DeepCompile")):
        if on:
            problems.append(Problem(path, f"turns on {what}, which dstrain does not provide; remove it or turn "
                                          f"it off", True))
    if cfg.checkpoint.load_universal:
        problems.append(Problem("checkpoint.load_universal",
                                "universal checkpoints are not needed: dstrain checkpoints load at any data-parallel "
                                "size directly; remove the key", True))
    if problems:
        raise UnsupportedFeatureError(problems)

