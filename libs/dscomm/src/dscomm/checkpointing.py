"""Activation checkpointing, as `deepspeed.checkpointing`: `configure()` once, then `checkpoint(fn, *args)`.

It lives in dscomm so every parallel library (pipeline, MoE, tensor parallel) can use it and its
model-parallel RNG tracker without importing the facade; `dstrain.checkpointing` re-exports it.

`checkpoint` runs `fn` without keeping its intermediate activations and runs it again in backward.
Gradients are bitwise those of running `fn` plainly: the recompute sees the same inputs and the
same random numbers (CPU and device generators, and the model-parallel tracker's streams).

- Default: `torch.utils.checkpoint` (non-reentrant), so parameters get gradients even when no
  input requires grad, and `torch.autograd.grad` works.
- cpu_checkpointing: the saved inputs are copied to host memory while the forward computes on the
  device ones (a side-stream copy into pinned memory on CUDA, pageable where pinning fails), and
  copied back for the recompute; a no-op where they already are on the CPU.
- partition_activations with a model-parallel `mpu` of more than one rank (Megatron's mpu, or the
  ParallelGroups of `dscomm.ParallelDims(...).build()`, whose tensor group it uses): each rank keeps only
  its slice of every saved input (on the CPU with cpu_checkpointing) and the recompute
  all-gathers them. Inputs must be the same on every model-parallel rank, as in Megatron.
- contiguous_memory_optimization (with partition_activations): those slices are rows of one buffer
  per input position, `number_checkpoints` rows long, allocated once and reused every step instead
  of one allocation per checkpoint; a row is taken in forward and given back by its backward.
- An engine applies its config's section with `configure_from_engine` (each initialize() its own),
  unless the script called `configure()` itself, which then stands.
- synchronize_checkpoint_boundary: synchronise the device before and after each checkpoint.
- profile: time each checkpointed forward and its recompute (`profile_timings()`, and logged).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint

import dsconfig

logger = logging.getLogger("dscomm.checkpointing")

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"

__all__ = [
    "CudaRNGStatesTracker",
    "checkpoint",
    "configure",
    "configure_from_engine",
    "get_cuda_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "non_reentrant_checkpoint",
    "profile_timings",
    "reset",
]


# ---------------------------------------------------------------------------------------------- settings


class _Settings:
    def __init__(self) -> None:
        self.configured = False
        self.mpu: Any = None
        self.partition_activations = False
        self.contiguous_memory_optimization = False
        self.number_checkpoints: int | None = None
        self.cpu_checkpointing = False
        self.synchronize = False
        self.profile = False
        self.from_engine = False  # set by an engine's config, not by the script's own configure()


_settings = _Settings()
_timings: dict[str, list[float]] = {}
_NO_ROWS = dsconfig.Problem("activation_checkpointing.number_checkpoints",
                            "must be set (a positive integer) when contiguous_memory_optimization is on")


def _section(deepspeed_config: Any) -> dsconfig.ActivationCheckpointingConfig:
    if deepspeed_config is None:
        return dsconfig.ActivationCheckpointingConfig()
    if isinstance(deepspeed_config, dsconfig.ActivationCheckpointingConfig):
        return deepspeed_config
    if isinstance(deepspeed_config, dsconfig.DeepSpeedConfig):
        return deepspeed_config.activation_checkpointing
    if isinstance(deepspeed_config, dict | str | os.PathLike):
        # Only this section is read; keys for features not installed must not stop it.
        return dsconfig.load(deepspeed_config, strict=False).activation_checkpointing
    raise TypeError(f"configure(deepspeed_config=...) takes a path, a dict or a DeepSpeedConfig, "
                    f"got {type(deepspeed_config).__name__}")


def configure(mpu_: Any = None, deepspeed_config: Any = None, partition_activations: bool | None = None,
              contiguous_checkpointing: bool | None = None, num_checkpoints: int | None = None,
              checkpoint_in_cpu: bool | None = None, synchronize: bool | None = None,
              profile: bool | None = None) -> None:
    """Set the checkpointing options: the config's `activation_checkpointing` section, then any argument given.

    deepspeed_config: a config path, dict or `DeepSpeedConfig`. Arguments left None take the
    section's value (its defaults when there is no config). Calling again replaces every option.
    """
    _configure(mpu_, _section(deepspeed_config), partition_activations, contiguous_checkpointing, num_checkpoints,
               checkpoint_in_cpu, synchronize, profile, rows_now=True)


def _configure(mpu_: Any, section: dsconfig.ActivationCheckpointingConfig, partition_activations: bool | None,
               contiguous_checkpointing: bool | None, num_checkpoints: int | None, checkpoint_in_cpu: bool | None,
               synchronize: bool | None, profile: bool | None, rows_now: bool, from_engine: bool = False) -> None:

    def pick(argument: Any, from_config: Any) -> Any:
        return from_config if argument is None else argument

    settings = _Settings()
    settings.mpu = mpu_
    settings.partition_activations = bool(pick(partition_activations, section.partition_activations))
    settings.contiguous_memory_optimization = bool(pick(contiguous_checkpointing,
                                                        section.contiguous_memory_optimization))
    settings.number_checkpoints = pick(num_checkpoints, section.number_checkpoints)
    settings.cpu_checkpointing = bool(pick(checkpoint_in_cpu, section.cpu_checkpointing))
    settings.synchronize = bool(pick(synchronize, section.synchronize_checkpoint_boundary))
    settings.profile = bool(pick(profile, section.profile))
    if settings.contiguous_memory_optimization:
        if not settings.partition_activations:
            raise dsconfig.ConfigError(dsconfig.Problem(
                "activation_checkpointing.contiguous_memory_optimization",
                "copies partitioned activations, so it needs activation_checkpointing.partition_activations: true"))
        if settings.number_checkpoints is None and rows_now:
            raise dsconfig.ConfigError(_NO_ROWS)
    settings.configured = True
    settings.from_engine = from_engine
    global _settings
    _settings = settings
    logger.debug("activation checkpointing: partition=%s cpu=%s contiguous=%s synchronize=%s profile=%s",
                 settings.partition_activations, settings.cpu_checkpointing,
                 settings.contiguous_memory_optimization, settings.synchronize, settings.profile)


def configure_from_engine(deepspeed_config: Any, mpu_: Any = None) -> None:
    """What an engine's initialize() applies: its config's section (its layout as the `mpu`), replacing
    what an earlier engine applied, but never what the script set with `configure()` itself."""
    if _settings.configured and not _settings.from_engine:
        return
    # Megatron-style scripts give number_checkpoints to configure() themselves (num_checkpoints=num_layers),
    # so a section without it is taken here; the first checkpoint that needs the rows asks for it.
    _configure(mpu_, _section(deepspeed_config), None, None, None, None, None, None, rows_now=False, from_engine=True)


def is_configured() -> bool:
    """Whether `configure()` has been called."""
    return _settings.configured


def reset() -> None:
    """Drop what checkpoints hold between calls (contiguous buffers, profile timings); the options stay.
    Call it after forward passes that had no backward (evaluation with grad enabled) under
    contiguous_memory_optimization, whose rows only a backward gives back."""
    _timings.clear()
    _CONTIGUOUS.clear()


def profile_timings() -> dict[str, dict[str, float]]:
    """With profile on: {'forward' | 'recompute': {'count', 'total_ms'}} since the last `reset()`."""
    return {name: {"count": count, "total_ms": total * 1e3} for name, (count, total) in _timings.items()}


# ---------------------------------------------------------------------------------------------- RNG


def _device_rng_module() -> Any:
    # The "device" generator is CUDA's where there is one and the CPU's otherwise, so the tracker
    # and model_parallel_cuda_manual_seed behave the same on a CPU-only machine.
    return torch.cuda if torch.cuda.is_available() else torch


def _get_device_rng_state() -> torch.Tensor:
    return _device_rng_module().get_rng_state()


def _set_device_rng_state(state: torch.Tensor) -> None:
    _device_rng_module().set_rng_state(state)


class CudaRNGStatesTracker:
    """Named generator states, swapped in with `fork(name)`: model-parallel ranks draw from their own stream."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} is already tracked")
        self.seeds_.add(seed)
        outside = _get_device_rng_state()
        _device_rng_module().manual_seed(seed)
        self.states_[name] = _get_device_rng_state()
        _set_device_rng_state(outside)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} is not tracked (known: {sorted(self.states_)}); "
                           f"call model_parallel_cuda_manual_seed() or add() first")
        outside = _get_device_rng_state()
        _set_device_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_device_rng_state()
            _set_device_rng_state(outside)


_RNG_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _RNG_TRACKER


def _mpu_value(mpu: Any, names: tuple[str, ...], default: Any) -> Any:
    for name in names:
        if hasattr(mpu, name):
            return getattr(mpu, name)()
    return default


def _mp_rank(mpu: Any) -> int:
    return _mpu_value(mpu, ("get_tensor_model_parallel_rank", "get_model_parallel_rank"), 0)


def _mp_world_size(mpu: Any) -> int:
    return _mpu_value(mpu, ("get_tensor_model_parallel_world_size", "get_model_parallel_world_size"), 1)


def _mp_group(mpu: Any) -> Any:
    return _mpu_value(mpu, ("get_tensor_model_parallel_group", "get_model_parallel_group"), None)


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the device generator with `seed` (same on every model-parallel rank) and the tracker's
    'model-parallel-rng' stream with seed + 2718 + the model-parallel rank (different per rank)."""
    model_parallel_seed = seed + 2718 + _mp_rank(_settings.mpu)
    _RNG_TRACKER.reset()
    _device_rng_module().manual_seed(seed)
    _RNG_TRACKER.add(_MODEL_PARALLEL_RNG_TRACKER_NAME, model_parallel_seed)


class _RngSnapshot:
    """The generators a checkpointed function may draw from that torch.utils.checkpoint does not restore."""

    def __init__(self, cuda_devices: list[torch.device]) -> None:
        self.tracker = _RNG_TRACKER.get_states()
        self.cpu = torch.get_rng_state()
        self.cuda = {device: torch.cuda.get_rng_state(device) for device in cuda_devices}

    def restore(self) -> None:
        _RNG_TRACKER.set_states(self.tracker)
        torch.set_rng_state(self.cpu)
        for device, state in self.cuda.items():
            torch.cuda.set_rng_state(state, device)


def _cuda_devices(args: tuple) -> list[torch.device]:
    return sorted({a.device for a in args if torch.is_tensor(a) and a.device.type == "cuda"}, key=str)


class _AutocastState:
    """The autocast modes active in forward, re-entered for the recompute (backward runs outside them)."""

    def __init__(self, device_types: tuple[str, ...]) -> None:
        self.modes = [(kind, torch.get_autocast_dtype(kind)) for kind in device_types
                      if torch.is_autocast_enabled(kind)]
        self.cache = torch.is_autocast_cache_enabled()

    def __call__(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for kind, dtype in self.modes:
            stack.enter_context(torch.autocast(kind, dtype=dtype, cache_enabled=self.cache))
        return stack


# ---------------------------------------------------------------------------------------------- timing


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def _timed(name: str) -> Iterator[None]:
    _synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        _synchronize()
        elapsed = time.perf_counter() - start
        count, total = _timings.get(name, (0, 0.0))
        _timings[name] = [count + 1, total + elapsed]
        logger.info("checkpoint %s: %.3f ms", name, elapsed * 1e3)


# ---------------------------------------------------------------------------------------------- checkpoint


def checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` without keeping its activations; recomputed in backward with the same RNG."""
    settings = _settings
    if settings.synchronize:
        _synchronize()
    if settings.partition_activations and _mp_world_size(settings.mpu) > 1:
        outputs = _checkpoint_partitioned(function, args, settings)
    else:
        outputs = _checkpoint_torch(function, args, settings)
    if settings.synchronize:
        _synchronize()
    return outputs


non_reentrant_checkpoint = checkpoint  # DeepSpeed's name for the variant this one already is


def _checkpoint_torch(function: Callable[..., Any], args: tuple, settings: _Settings) -> Any:
    run, stored = function, args
    offloaded = settings.cpu_checkpointing and any(torch.is_tensor(a) and a.device.type != "cpu" for a in args)
    cuda_devices = _cuda_devices(args)
    if offloaded:
        # The recompute closure holds `stored`, so the copies on the host are what stays alive. The
        # forward itself computes on the device inputs while those copies are made, so its outputs'
        # graph reaches the original inputs; the recompute runs on the copies brought back.
        copies = [_HostCopy(a) if torch.is_tensor(a) and a.device.type != "cpu" else None for a in args]
        stored = tuple(c.host if c is not None else a for a, c in zip(args, copies))
        pending: list[tuple] = [args]  # the device inputs, for the forward only

        def run(*host_args: Any) -> Any:
            if pending:
                return function(*pending.pop())
            return function(*(c.restore() if c is not None else a for a, c in zip(host_args, copies)))

    def contexts() -> tuple[Any, Any]:
        # torch.utils.checkpoint restores the generators and autocast of the inputs' device; with
        # the inputs moved to the host that device is the CPU, so the CUDA ones are kept here.
        snapshot = _RngSnapshot(cuda_devices if offloaded else [])
        autocast = _AutocastState(("cuda",) if offloaded and cuda_devices else ())
        return _ForwardContext(settings), _RecomputeContext(snapshot, autocast, settings)

    return torch.utils.checkpoint.checkpoint(run, *stored, use_reentrant=False, preserve_rng_state=True,
                                             context_fn=contexts)


class _ForwardContext:
    def __init__(self, settings: _Settings) -> None:
        self._timer = _timed("forward") if settings.profile else contextlib.nullcontext()

    def __enter__(self) -> None:
        self._timer.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._timer.__exit__(*exc)


class _RecomputeContext:
    """Put back the tracker streams (and offloaded inputs' CUDA generators) as they were in forward."""

    def __init__(self, snapshot: _RngSnapshot, autocast: _AutocastState, settings: _Settings) -> None:
        self._snapshot = snapshot
        self._stack = contextlib.ExitStack()
        self._autocast = autocast
        self._profile = settings.profile
        self._outside = snapshot

    def __enter__(self) -> None:
        self._outside = _RngSnapshot(list(self._snapshot.cuda))
        cpu_state = torch.get_rng_state()  # torch.utils.checkpoint has already set the CPU generator
        self._snapshot.restore()
        torch.set_rng_state(cpu_state)
        self._stack.enter_context(self._autocast())
        if self._profile:
            self._stack.enter_context(_timed("recompute"))

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        cpu_state = torch.get_rng_state()
        self._outside.restore()
        torch.set_rng_state(cpu_state)


_COPY_STREAMS: dict[torch.device, Any] = {}  # one side stream per device for cpu_checkpointing's copies


class _HostCopy:
    """A device tensor's copy in host memory: pinned and made on a side stream on CUDA, so the forward
    goes on while it is copied; brought back on the compute stream once that copy is done."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.device, self.requires_grad = tensor.device, tensor.requires_grad
        self.event = None
        value = tensor.detach()
        if value.device.type != "cuda":
            self.host = value.to("cpu")
            return
        try:
            self.host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        except RuntimeError:  # pinning can fail under a tight memlock limit (ulimit -l): a blocking copy then
            self.host = value.to("cpu")
            return
        stream = _COPY_STREAMS.get(value.device)
        if stream is None:
            stream = _COPY_STREAMS[value.device] = torch.cuda.Stream(value.device)
        stream.wait_stream(torch.cuda.current_stream(value.device))  # after the ops that produce it
        with torch.cuda.stream(stream):
            self.host.copy_(value, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(stream)
        value.record_stream(stream)  # the allocator keeps its memory until the copy has read it

    def restore(self) -> torch.Tensor:
        if self.event is not None:
            torch.cuda.current_stream(self.device).wait_event(self.event)
        value = self.host.to(self.device, non_blocking=self.event is not None)
        # As the forward's input was: the recompute must save what the forward saved.
        return value.requires_grad_(self.requires_grad) if value.is_floating_point() else value


# ---------------------------------------------------------------------------------------------- partitioned


class _ContiguousRows:
    """contiguous_memory_optimization: per (input position, slice size, dtype, place), one buffer of
    `number_checkpoints` rows that the slices of that input live in, reused from step to step. A row is
    taken in forward and given back by its checkpoint's backward (any order: pipeline schedules
    interleave micro-batches)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.free: dict[tuple, list[int]] = {}

    def take(self, key: tuple, rows: int) -> tuple[torch.Tensor, int]:
        position, chunk, dtype, device, pinned = key
        if key not in self.buffers:
            pin = pinned and torch.cuda.is_available()
            self.buffers[key] = torch.empty(rows, chunk, dtype=dtype, device=device, pin_memory=pin)
            self.free[key] = list(range(rows - 1, -1, -1))
        if not self.free[key]:
            raise dsconfig.ConfigError(dsconfig.Problem(
                "activation_checkpointing.number_checkpoints",
                f"is {rows}, but more checkpoints than that hold partitioned input {position} at once; raise it "
                f"to the number of checkpointed layers, or call checkpointing.reset() after forward passes "
                f"without backward", rows))
        row = self.free[key].pop()
        return self.buffers[key][row], row

    def give_back(self, key: tuple, row: int) -> None:
        if key in self.free:  # gone if reset() ran in between
            self.free[key].append(row)

    def clear(self) -> None:
        self.buffers.clear()
        self.free.clear()


_CONTIGUOUS = _ContiguousRows()


class _Slice:
    """This rank's share of a tensor input that every model-parallel rank holds the same copy of."""

    def __init__(self, tensor: torch.Tensor, rank: int, world: int, to_cpu: bool, position: int = 0,
                 contiguous_rows: int | None = None) -> None:
        self.shape, self.dtype, self.device = tensor.shape, tensor.dtype, tensor.device
        self.requires_grad = tensor.requires_grad
        self.numel = tensor.numel()
        self.chunk = -(-self.numel // world)  # ceil: the last slices are zero-padded
        flat = tensor.detach().reshape(-1)
        part = flat[rank * self.chunk:(rank + 1) * self.chunk]
        self.row: tuple | None = None
        if contiguous_rows is not None:
            key = (position, self.chunk, self.dtype, torch.device("cpu") if to_cpu else self.device, to_cpu)
            self.part, index = _CONTIGUOUS.take(key, contiguous_rows)
            self.row = (key, index)
            self.part[part.numel():].zero_()
            self.part[:part.numel()].copy_(part)
            return
        padded = torch.zeros(self.chunk, dtype=self.dtype, device=self.device)
        padded[:part.numel()] = part
        self.part = padded.to("cpu") if to_cpu else padded  # a fresh contiguous copy either way

    def release(self) -> None:
        if self.row is not None:
            _CONTIGUOUS.give_back(*self.row)
            self.row = None

    def gather(self, group: Any, world: int) -> torch.Tensor:
        mine = self.part.to(self.device)
        pieces = [torch.empty_like(mine) for _ in range(world)]
        torch.distributed.all_gather(pieces, mine, group=group)
        full = torch.cat(pieces)[:self.numel].view(self.shape)
        return full.requires_grad_(self.requires_grad)


def _checkpoint_partitioned(function: Callable[..., Any], args: tuple, settings: _Settings) -> Any:
    if not torch.is_grad_enabled():
        return function(*args)  # no backward will come: nothing to keep
    outputs = _PartitionedCheckpoint.apply(function, settings, *args)
    return outputs


class _PartitionedCheckpoint(torch.autograd.Function):
    # Reentrant by necessity: only a custom Function can drop the full input after forward and
    # rebuild it in backward; the gradient of the gathered input is the gradient of the input.

    @staticmethod
    def forward(ctx: Any, function: Callable[..., Any], settings: _Settings, *args: Any) -> Any:
        mpu = settings.mpu
        ctx.function, ctx.settings = function, settings
        ctx.group, ctx.world = _mp_group(mpu), _mp_world_size(mpu)
        ctx.rng = _RngSnapshot(_cuda_devices(args))
        ctx.autocast = _AutocastState(("cuda", "cpu"))
        with _timed("forward") if settings.profile else contextlib.nullcontext(), torch.no_grad():
            outputs = function(*args)
        rank = _mp_rank(mpu)
        rows = settings.number_checkpoints if settings.contiguous_memory_optimization else None
        if settings.contiguous_memory_optimization and rows is None:
            raise dsconfig.ConfigError(_NO_ROWS)  # the engine's section left it to the script, which did not set it
        ctx.stored = [_Slice(a, rank, ctx.world, settings.cpu_checkpointing, position, rows)
                      if torch.is_tensor(a) else a for position, a in enumerate(args)]
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        inputs = [item.gather(ctx.group, ctx.world) if isinstance(item, _Slice) else item for item in ctx.stored]
        for item in ctx.stored:
            if isinstance(item, _Slice):
                item.release()
        outside = _RngSnapshot(list(ctx.rng.cuda))
        ctx.rng.restore()
        try:
            timer = _timed("recompute") if ctx.settings.profile else contextlib.nullcontext()
            with timer, torch.enable_grad(), ctx.autocast():
                outputs = ctx.function(*inputs)
        finally:
            outside.restore()
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(out, grad) for out, grad in zip(outputs, grads)
                 if torch.is_tensor(out) and out.requires_grad and grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        input_grads = [inp.grad if torch.is_tensor(inp) else None for inp in inputs]
        return (None, None, *input_grads)
