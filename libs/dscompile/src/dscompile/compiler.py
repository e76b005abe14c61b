"""`deepcompile()`: compile a module that a dszero `ZeroOptimizer` trains, with ZeRO in the graph.

    runtime = dscompile.deepcompile(model, zero, dsconfig.CompileConfig(deepcompile=True), backend="inductor")
    loss = model(batch); zero.backward(loss); zero.step()

The module is compiled in place (as `torch.nn.Module.compile`); its calls then run inside the runtime's
forward window. A backend that fails to compile the model leaves it running as eager ZeRO, with a
warning naming the cause (a graph break is not a failure: the code around it runs as eager ZeRO).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from dsconfig import CompileConfig

from .backend import DeepCompileBackend
from .errors import DeepCompileError
from .graphinfo import Budgets
from .runtime import DeepCompileRuntime

logger = logging.getLogger("dscompile")


def deepcompile(module: torch.nn.Module, zero: Any, settings: CompileConfig | None = None, *,
                backend: str = "inductor", compile_kwargs: dict | None = None, schedule: Any = None,
                step: Callable[[], int] | None = None, budgets: Budgets | None = None) -> DeepCompileRuntime:
    """Compile `module` (trained by the dszero optimizer `zero`) with DeepCompile's passes.

    settings: the config's compile section; schedule: [(step, [pass names or callables])], None for the
    reference's default; step: the optimizer step counter the schedule follows (default: the steps of
    zero's torch optimizer);
    budgets: override the memory budgets taken from zero's config.
    """
    kwargs = dict(compile_kwargs or {})
    if "backend" in kwargs:
        logger.warning("compile_kwargs['backend'] = %r is ignored: DeepCompile uses the backend argument (%r)",
                       kwargs.pop("backend"), backend)
    inductor_options = dict(kwargs.pop("options", None) or {})
    mode = kwargs.pop("mode", None)
    if mode is not None:
        if backend != "inductor":
            raise DeepCompileError(f"compile_kwargs['mode'] = {mode!r} is an inductor setting; backend is {backend!r}")
        inductor_options = {**torch._inductor.list_mode_options(mode), **inductor_options}
    runtime = DeepCompileRuntime(zero, settings, schedule=schedule, step=step, budgets=budgets)
    compiler = DeepCompileBackend(runtime, backend, inductor_options)
    runtime.module = module
    runtime.controls.remove_module_hooks()  # stage 3: the graphs gather; EagerGather covers eager code
    try:
        module.compile(backend=compiler, **kwargs)
    except Exception:
        _uninstall(runtime)
        raise
    compiled = module._compiled_call_impl

    def call(*args: Any, **kw: Any) -> Any:
        if runtime.closed:
            return module._call_impl(*args, **kw)
        try:
            with runtime.forward_window():
                return compiled(*args, **kw)
        except (torch._dynamo.exc.BackendCompilerFailed, DeepCompileError) as error:
            cause = getattr(error, "inner_exception", None) or error
            logger.warning("DeepCompile could not compile %s (%s: %s); it runs as eager ZeRO from here",
                           type(module).__name__, type(cause).__name__, cause)
            runtime.fell_back = f"{type(cause).__name__}: {cause}"
            _uninstall(runtime)
            return module._call_impl(*args, **kw)

    module._compiled_call_impl = call
    runtime.compiler = compiler
    return runtime


def _uninstall(runtime: DeepCompileRuntime) -> None:
    """Back to eager ZeRO: the module uncompiled, the runtime closed (dszero's hooks back)."""
    runtime.module._compiled_call_impl = None
    runtime.close()


def uncompile(runtime: DeepCompileRuntime) -> None:
    """Stop compiling: the module runs as eager ZeRO again."""
    _uninstall(runtime)
