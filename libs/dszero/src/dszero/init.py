"""`dszero.Init`: partition parameters while the model is built, so the whole model never sits on one rank.

    with dszero.Init():
        model = MyModel()          # each module's parameters are partitioned as its __init__ returns
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), dsconfig.ZeroConfig(stage=3))

Inside the context every `nn.Module` subclass's `__init__` is wrapped: when a module's outermost
`__init__` returns, each of its own trainable parameters is broadcast from rank 0 and replaced by
this rank's shard (the parameter becomes an empty tensor; `param.ds_shape` / `param.ds_numel`
give its full size; `param.ds_tensor` is a view of the piece this rank stores, unless NVMe holds
it). A rank therefore holds at most one module's whole parameters at a time, plus its shards of the
rest. `nn.MultiheadAttention` writes its child projection's weights in its own
`__init__`, so its children are partitioned when it finishes. A module that writes into its
children's parameters after building them must do so inside
`dszero.GatheredParameters(child.parameters(), modifier_rank=0)`.

Given a DeepSpeed config (or a `dtype`), the context also makes torch's tensor constructors build
floating-point tensors in the training dtype (the config's bf16 / fp16, float32 otherwise), as DeepSpeed's
does; see partition_parameters.py.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dscomm
from dsconfig import OffloadParamConfig, ZeroConfig, resolve_auto

from .errors import ZeroConfigError, ZeroError
from .offload.param_homes import ParamHomes
from .units import FUSED_MODULES, Unit

_active: list[Init] = []  # nested contexts: only the outermost one partitions


def _contradicting_single_rank_pg_error(dp_world_size: int, explicit_process_group: Any,
                                        env: Mapping[str, Any] | None = None) -> str | None:
    """Why partitioning over a one-rank group would be wrong here, or None. A launcher that started several
    processes (WORLD_SIZE > 1) while the process group already up has one rank (a library initialised one of its
    own before Init) would leave every rank building the whole model: an out-of-memory that looks like a model too
    big. A one-rank group passed explicitly is taken as meant; a WORLD_SIZE that is not a number is not judged."""
    if dp_world_size != 1 or explicit_process_group is not None:
        return None
    env = os.environ if env is None else env
    try:
        launched = int(env.get("WORLD_SIZE") or 0)
    except (TypeError, ValueError):
        return None
    if launched <= 1:
        return None
    return (f"zero.Init would partition over a process group of 1 rank, but the launcher started WORLD_SIZE="
            f"{launched} processes: every rank would build the whole model. A one-rank process group was set up "
            f"before zero.Init (by a library, or by a model loaded first); call deepspeed.init_distributed() (or "
            f"dscomm.init_distributed()) before anything else, or pass data_parallel_group= to mean a one-rank group")


class Init:
    """DeepSpeed's `deepspeed.zero.Init`, with its signature.

    module: an already built module to partition now, as if it had been built inside the context.
    data_parallel_group / mpu: the group to partition over (default: dscomm's data-parallel group).
    remote_device: None (stay on the parameters' device), "cpu" or "nvme" (then config's
        zero_optimization.offload_param gives nvme_path and the buffers); default: the config's
        offload_param.device when a config is given.
    pin_memory: pin CPU shards (remote_device "cpu").
    config_dict_or_path / config: a DeepSpeed config (dict, JSON path, dsconfig.DeepSpeedConfig) or a
        dsconfig.ZeroConfig, read for offload_param.
    enabled: False makes the context do nothing.
    dtype: cast floating-point parameters to this dtype before partitioning them, and make floating-point
        tensors in it while the context is active. Default: with a full DeepSpeed config, its bf16 / fp16
        (float32 when neither is on), as DeepSpeed; otherwise None (dtypes stay as built).
    tensor_overrides: which of "dtype" and "device" the constructors override (DeepSpeed's
        DeepSpeedTensorOverride names); constructors keep torch's default device here (the engine moves the
        module), so only "dtype" changes anything.
    mem_efficient_linear: accepted for compatibility; linear layers need nothing special here.
    """

    def __init__(self, module: torch.nn.Module | None = None, data_parallel_group: Any = None,
                 mem_efficient_linear: bool = True, remote_device: str | None = None, pin_memory: bool = False,
                 config_dict_or_path: Any = None, config: Any = None, enabled: bool = True,
                 dtype: torch.dtype | None = None, mpu: Any = None, tensor_overrides: Any = ("dtype", "device")):
        self.enabled = enabled
        self.dtype = dtype
        if not enabled:
            return
        if not dscomm.is_initialized():
            dscomm.init_distributed()
        if data_parallel_group is None and mpu is not None:
            data_parallel_group = mpu.get_data_parallel_group()
        self.group = data_parallel_group if data_parallel_group is not None else dscomm.groups.get_data_parallel_group()
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        # the world, not the data-parallel group: a pipeline or tensor-parallel layout may leave that one rank
        contradiction = _contradicting_single_rank_pg_error(dist.get_world_size(), data_parallel_group)
        if contradiction is not None:
            raise ZeroError(contradiction)
        zero, config_dtype = _read_config(config_dict_or_path if config_dict_or_path is not None else config)
        if self.dtype is None:
            self.dtype = config_dtype
        self._overrides = {getattr(item, "name", item) for item in tensor_overrides}
        self._restore_constructors: Any = None
        self.homes = ParamHomes(param_offload(zero, remote_device, pin_memory), dist.get_rank(), None)
        self._patched: list[tuple[type, Any]] = []
        self._building: list[torch.nn.Module] = []
        self._depth: dict[int, int] = {}
        if module is not None:
            for submodule in module.modules():
                self._partition(submodule, recurse=isinstance(submodule, FUSED_MODULES))

    # ------------------------------------------------------------------ the context
    def __enter__(self) -> Init:
        if not self.enabled:
            return self
        _active.append(self)
        if len(_active) == 1:
            for cls in _subclasses(torch.nn.Module):
                self._wrap(cls)
            self._original_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
            context = self

            def init_subclass(cls, **kwargs):  # classes defined inside the context are wrapped too
                super(torch.nn.Module, cls).__init_subclass__(**kwargs)
                context._wrap(cls)
            torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
            if self.dtype is not None and "dtype" in self._overrides:
                from .partition_parameters import override_constructors  # it imports this module

                self._restore_constructors = override_constructors(self.dtype, None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        _active.pop()
        if _active:
            return
        for cls, original in reversed(self._patched):
            cls.__init__ = original
        self._patched = []
        if self._original_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._original_init_subclass
        if self._restore_constructors is not None:
            self._restore_constructors()
            self._restore_constructors = None

    def _wrap(self, cls: type) -> None:
        original = cls.__dict__.get("__init__")
        if original is None or getattr(original, "_dszero_wrapped", False):
            return
        context = self

        @functools.wraps(original)
        def init(module, *args, **kwargs):
            key = id(module)
            outermost = key not in context._depth
            context._depth[key] = context._depth.get(key, 0) + 1
            if outermost:
                context._building.append(module)
            try:
                original(module, *args, **kwargs)
            finally:
                context._depth[key] -= 1
                if outermost:
                    del context._depth[key]
                    context._building.pop()
            if outermost:
                context._after_init(module)
        init._dszero_wrapped = True
        cls.__init__ = init
        self._patched.append((cls, original))

    def _after_init(self, module: torch.nn.Module) -> None:
        if any(isinstance(m, FUSED_MODULES) for m in self._building):
            return  # a fused module still writes its children's weights; it partitions them when done
        self._partition(module, recurse=isinstance(module, FUSED_MODULES))

    # ------------------------------------------------------------------ partitioning
    def _partition(self, module: torch.nn.Module, recurse: bool) -> None:
        partitioned = False
        for name, param in module.named_parameters(recurse=recurse):
            if getattr(param, "_dszero_unit", None) is not None or not param.requires_grad:
                continue
            if self.dtype is not None and param.is_floating_point():
                param.data = param.data.to(self.dtype)
            Unit(module, [param], [f"{type(module).__name__}.{name}"], self.world, self.rank, param.dtype,
                 persistent=False, group=self.group, homes=self.homes, partition_only=True)
            partitioned = True
        if partitioned:
            module.register_forward_pre_hook(_refuse_partitioned_call)


def _refuse_partitioned_call(module: torch.nn.Module, args: Any) -> None:
    """A module built under Init holds shards until a stage-3 engine takes its parameters over: calling it
    before that would fail deep inside with an empty tensor's shape. Say what happened instead."""
    for name, param in module.named_parameters(recurse=False):
        unit = getattr(param, "_dszero_unit", None)
        if unit is not None and unit.partition_only and not unit.resident and not unit.scheduled:
            raise ZeroError(f"{type(module).__name__} was built inside dszero.Init (zero.Init), so its parameter "
                            f"{name!r} is partitioned across the ranks; call the model through the engine that "
                            f"initialize() returns (ZeRO stage 3), or inside dszero.GatheredParameters")


def _subclasses(cls: type) -> list[type]:
    found, stack = [], [cls]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(current.__subclasses__())
    return found


_SECTIONS = ("zero_optimization", "bf16", "bfloat16", "fp16")


def _read_config(source: Any) -> tuple[ZeroConfig | None, torch.dtype | None]:
    """(the ZeRO section, the training dtype) of a config: a dsconfig.ZeroConfig (no dtype), a
    dsconfig.DeepSpeedConfig, a dict or a JSON path. "auto" values (Hugging Face's) are left as they are."""
    if source is None or isinstance(source, ZeroConfig):
        return source, None
    if not hasattr(source, "zero_optimization"):
        import dsconfig

        if isinstance(source, (str, Path)):
            source = json.loads(Path(source).read_text())
        # Only the sections Init reads: the batch triple and the rest belong to the engine, and may not be
        # complete yet (Hugging Face builds the model before the Trainer knows the world size).
        read = {key: source[key] for key in _SECTIONS if key in source}
        source = dsconfig.load(read, strict=False)
    bf16, fp16 = source.bf16.enabled is True, source.fp16.enabled is True  # dsconfig refuses both at once
    return source.zero_optimization, torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32


def param_offload(zero: ZeroConfig | None, remote_device: str | None, pin_memory: bool) -> OffloadParamConfig | None:
    """The offload_param section that places the shards: remote_device ("cpu", "nvme") over the config's own."""
    configured = zero.offload_param if zero is not None else None
    device = remote_device or (configured.device if configured is not None else "none")
    if device in ("none", None):
        return None
    if device == "cpu":
        return OffloadParamConfig(device="cpu", pin_memory=pin_memory or bool(configured and configured.pin_memory))
    if device == "nvme":
        if configured is None or configured.device != "nvme":
            raise ZeroConfigError("dszero.Init(remote_device='nvme') needs a config whose "
                                  "zero_optimization.offload_param has device 'nvme' and an nvme_path")
        return resolve_auto(configured)
    raise ZeroConfigError(f"dszero.Init: remote_device = {remote_device!r}; valid: None, 'cpu', 'nvme'")
