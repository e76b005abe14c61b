"""engine.compile() with compile.deepcompile: true: DeepSpeed's DeepCompile, from dscompile.

The module is compiled in place with ZeRO's all-gathers, releases and reductions inserted into its
graphs and scheduled there (prefetch, selective gather, activation freeing, offloads, as the config's
compile section and `schedule=` say), all through the engine's own dszero optimizer: the same
partitioning, gradient accumulation, clipping, loss scaling and checkpoints as eager ZeRO, so a compiled
run saves what an eager one loads and the other way round. The schedule follows the engine's optimizer
steps (global_steps), as DeepSpeed's does.
"""

from __future__ import annotations

from typing import Any

from dsconfig import Problem

from ..errors import DstrainError, UnsupportedFeatureError
from ..logs import log_on_rank0
from .optional_libs import require


def compile_deepcompile(engine: Any, backend: str, compile_kwargs: dict | None, schedule: Any) -> Any:
    """Compile engine.module with DeepCompile; returns dscompile's runtime (None at ZeRO stage 0, which the
    reference compiles plainly: there is no partitioning to schedule)."""
    config = engine._config
    zero = config.zero_optimization
    if "autosp" in config.compile.passes:  # Ulysses by a compiler pass: dsseq's, beside ZeRO 0-2
        from .dsseq import compile_autosp

        return compile_autosp(engine, backend, compile_kwargs)
    if "autotp" in config.compile.passes:  # AutoTP's collectives in the graph: dstp's pass, beside ZeRO 0-2
        from .dstp import compile_autotp

        return compile_autotp(engine, backend, compile_kwargs)
    if zero.stage == 0:
        log_on_rank0(engine.global_rank, "compile.deepcompile schedules ZeRO stages 1-3; at stage 0 the model is "
                                          "compiled with plain torch.compile, as DeepSpeed falls back to it")
        if "long_context_checkpointing" in config.compile.passes:  # its partitioner needs no ZeRO
            backend = require("dscompile", "compile.passes long_context_checkpointing").long_context_backend(backend)
        engine.module.compile(backend=backend, **(compile_kwargs or {}))
        return None
    problems = []  # compile.passes autosp / autotp were routed to their own passes above
    for key, on in (("zero_quantized_weights", zero.zero_quantized_weights),
                    ("zero_quantized_gradients", zero.zero_quantized_gradients),
                    ("zero_hpz_partition_size", zero.zero_hpz_partition_size > 1)):
        if on and zero.stage == 3:
            problems.append(Problem(f"zero_optimization.{key}", "ZeRO++ quantizes eager ZeRO-3's collectives; "
                                                                "DeepCompile's gathers and reductions are plain, so "
                                                                "one of the two must go", getattr(zero, key)))
    if problems:
        raise UnsupportedFeatureError(problems)
    if engine.optimizer is None:
        raise DstrainError("engine.compile() with compile.deepcompile needs an optimizer (ZeRO's partitioning is "
                           "what DeepCompile schedules): add an \"optimizer\" section or pass optimizer=")
    dscompile = require("dscompile", "compile.deepcompile")
    return dscompile.deepcompile(engine.module, engine.optimizer, config.compile, backend=backend,
                                 compile_kwargs=compile_kwargs, schedule=schedule, step=lambda: engine.global_steps)


def uncompile(runtime: Any) -> None:
    """The module trains as eager ZeRO again (engine.destroy())."""
    from .dsseq import is_autosp_runtime, uncompile_autosp
    from .dstp import is_autotp_runtime, uncompile_autotp

    if is_autosp_runtime(runtime):
        uncompile_autosp(runtime)
        return
    if is_autotp_runtime(runtime):
        uncompile_autotp(runtime)
        return
    require("dscompile", "compile.deepcompile").uncompile(runtime)
