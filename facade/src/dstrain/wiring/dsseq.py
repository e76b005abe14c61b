"""Ulysses sequence parallelism (dsseq) in the run's layout: `sequence_parallel_size` ranks split each
sample's sequence; data-parallel replicas are the rest of the world.

As in DeepSpeed:
- the batch triple counts data-parallel ranks only (train_batch_size = micro x accumulation x data);
- ZeRO partitions and reduces over the sequence x data ranks (DeepSpeed's sequence-data-parallel group),
  averaging over all of them: each sequence rank back-propagates its slice's share of the loss, and a
  loss gathered over the sequence ranks (dsseq.sequence_parallel_loss, DeepSpeed's tutorial loss) makes
  that average the whole sequence's gradient;
- gradients go over the wire in `seq_parallel_communication_data_type` (default fp32), which replaces
  communication_data_type while sequence parallelism is on.
The engine's own data loader deals batches by data-parallel rank: the sequence ranks of a replica read
the same batches (each takes its slice: dsseq.shard_batch, or AutoSP in the compiled graph).

The attention itself is the script's: DistributedAttention around its attention, or
UlyssesSPAttentionHF.register_with_transformers (whose returned groups initialize(mpu=...) reuses).
What sequence parallelism is not composed with here is refused by key.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import attrs
import torch

import dscomm
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError
from .optional_libs import imported, require

KEY = "sequence_parallel_size"
LONG_CONTEXT = "long_context_checkpointing"  # compile.passes: dscompile's selective activation checkpointing


def sequence_degree(config: DeepSpeedConfig) -> int:
    return max(config.sequence_parallel_size, 1)


def is_sequence_mpu(mpu: Any) -> bool:
    """An `mpu` with sequence parallelism on: DeepSpeed's parallel_state_sp (whose "model parallel" getters
    alias the sequence group), the groups register_with_transformers returns, or a Megatron-DeepSpeed mpu
    with a sequence-parallel size above 1."""
    getter = getattr(mpu, "get_sequence_parallel_world_size", None)
    return callable(getter) and int(getter()) > 1


def mpu_sequence_size(mpu: Any, configured: int) -> int:
    """The sequence-parallel size of a sequence `mpu`; it must agree with sequence_parallel_size when the
    config sets one (DeepSpeed's tutorial sets both)."""
    size = int(mpu.get_sequence_parallel_world_size())
    if configured > 1 and configured != size:
        raise ConfigError(Problem(KEY, f"differs from the mpu's sequence-parallel size {size} "
                                       f"(register_with_transformers(sequence_parallel_size=...)); make them agree",
                                  configured))
    return size


def with_sequence_settings(config: DeepSpeedConfig, sequence: int) -> DeepSpeedConfig:
    """The config as the run uses it: the layout's sequence size (an mpu's may set it), and gradients
    communicated in seq_parallel_communication_data_type while it is above 1."""
    if sequence == 1:
        return config
    given = config.communication_data_type
    wire = config.seq_parallel_communication_data_type
    if given is not None and given != wire:
        warnings.warn(f"communication_data_type is {given!r} but sequence_parallel_size {sequence} communicates "
                      f"gradients in seq_parallel_communication_data_type ({wire!r}), as DeepSpeed does; set that "
                      f"key instead", stacklevel=3)
    return attrs.evolve(config, sequence_parallel_size=sequence, communication_data_type=wire)


def check_composition(config: DeepSpeedConfig, model: torch.nn.Module) -> None:
    """Refuse, by key, what sequence parallelism is not composed with in this dstrain."""
    sequence = sequence_degree(config)
    if sequence == 1:
        return
    problems = []
    de = config.data_efficiency
    others = [("expert_parallel.enabled", config.expert_parallel.enabled, "AutoEP's experts are grouped over data "
                                                                          "ranks"),
              ("data_efficiency.enabled", de.enabled or de.data_sampling.curriculum_learning.enabled
               or de.data_routing.random_ltd.enabled, "its sampler and token dropping act on whole sequences"),
              ("curriculum_learning.enabled", config.curriculum_learning.enabled,
               "the sequence-length curriculum cuts whole sequences")]
    for key, on, why in others:
        if on:
            problems.append(Problem(KEY, f"is not composed with {key} in this dstrain ({why}); set one of them off",
                                    sequence))
    if imported("dsmoe"):
        import dsmoe

        layers = dsmoe.moe_layers(model)
        if layers:
            problems.append(Problem(KEY, f"is not composed with MoE layers in this dstrain (the model's "
                                         f"{layers[0][0]!r}, ...: experts are grouped and reduced over data ranks); "
                                         f"set it to 1", sequence))
    if problems:
        raise UnsupportedFeatureError(problems)


def groups_for(dims: dscomm.ParallelDims, mpu: Any) -> dscomm.ParallelGroups:
    """The layout's groups: those of a sequence mpu built for the same layout (register_with_transformers's,
    which its attention already uses), else built now (collective)."""
    if isinstance(mpu, dscomm.ParallelGroups) and mpu.dims == dims and mpu.global_rank == dscomm.get_rank():
        return mpu
    groups = dims.build()
    if mpu is not None and is_sequence_mpu(mpu):
        check_sequence_mpu(mpu, groups)
    return groups


def check_sequence_mpu(mpu: Any, groups: dscomm.ParallelGroups) -> None:
    """A sequence mpu's groups hold the layout's ranks (sequence ranks next to each other)."""
    ranks = dscomm.groups.get_group_ranks(mpu.get_sequence_parallel_group())
    if list(ranks) != groups.ranks("sequence"):
        raise UnsupportedFeatureError([Problem("mpu", f"its sequence-parallel group holds ranks {list(ranks)} on rank "
                                                      f"{dscomm.get_rank()}, but dstrain lays out {groups.dims} with "
                                                      f"the sequence group {groups.ranks('sequence')} (consecutive "
                                                      f"ranks, as DeepSpeed's)", True)])


def zero_group(groups: dscomm.ParallelGroups) -> Any:
    """Where ZeRO partitions and reduces: sequence x data (the data group itself without sequence parallelism)."""
    return groups.sequence_data


def compile_autosp(engine: Any, backend: str, compile_kwargs: dict | None) -> Any:
    """engine.compile() with `"compile": {"deepcompile": true, "passes": ["autosp"]}`: the module compiled by
    dsseq's AutoSP over the run's sequence group (the pass inserts Ulysses' all-to-alls into the graph).
    ZeRO 0-2 reduce the gradients as for any module; returns dsseq's runtime."""
    config = engine._config
    problems = []
    if sequence_degree(config) == 1:
        problems.append(Problem(KEY, "compile.passes \"autosp\" shards each sequence over the sequence-parallel "
                                     "ranks: set sequence_parallel_size above 1 (a divisor of the world size)",
                                config.sequence_parallel_size))
    if config.zero_optimization.stage == 3:
        problems.append(Problem("zero_optimization.stage", "AutoSP runs with ZeRO stages 0-2 (DeepSpeed's example "
                                                           "uses 0); stage 3's gathers are DeepCompile's ZeRO passes, "
                                                           "which do not run beside autosp", 3))
    other = [name for name in config.compile.passes if name not in ("autosp", LONG_CONTEXT)]
    if other:
        problems.append(Problem("compile.passes", f"autosp runs alone or with {LONG_CONTEXT}; remove {other}",
                                config.compile.passes))
    if problems:
        raise UnsupportedFeatureError(problems)
    import dsseq

    if LONG_CONTEXT in config.compile.passes:  # AutoSP's companion: dscompile's partitioner under the backend
        backend = require("dscompile", f"compile.passes {LONG_CONTEXT}").long_context_backend(backend)
    return dsseq.compile_autosp(engine.module, engine.seq_parallel_group, backend=backend,
                                compile_kwargs=compile_kwargs)


def is_autosp_runtime(runtime: Any) -> bool:
    return imported("dsseq") and isinstance(runtime, sys.modules["dsseq"].AutoSPRuntime)


def uncompile_autosp(runtime: Any) -> None:
    sys.modules["dsseq"].uncompile_autosp(runtime)
