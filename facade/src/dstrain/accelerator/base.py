"""The accelerator interface DeepSpeed scripts call (`get_accelerator().device_name(i)`, ...), with what
every backend shares. A backend names its device type and its torch module; the rest follows."""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch


class Accelerator:
    """A device type as DeepSpeed's accelerator presents it. Subclasses: CpuAccelerator, CudaAccelerator."""

    _name = ""
    _communication_backend = ""
    _compile_backend = "inductor"

    # ------------------------------------------------------------------ devices
    def device_name(self, device_index: int | None = None) -> str:
        return self._name if device_index is None else f"{self._name}:{device_index}"

    def device(self, device_index: int | None = None) -> torch.device:
        return torch.device(self.device_name(device_index))

    def current_device_name(self) -> str:
        return self.device_name(self.current_device())

    def is_synchronized_device(self) -> bool:
        """True where work runs in program order on the host (no streams to wait for)."""
        return False

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    # ------------------------------------------------------------------ random numbers
    def random(self) -> Any:
        """torch.random, whose `fork_rng(device_type="cpu")` (what DeepSpeed's scripts pass as the accelerator's
        device name on a CPU) forks the CPU generator instead of looking for a `torch.cpu` device generator."""
        return _HOST_RANDOM

    def manual_seed(self, seed: int) -> Any:
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> Any:
        return torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        torch.set_rng_state(new_state)

    def default_generator(self, device_index: int) -> torch.Generator:
        return torch.default_generator

    # ------------------------------------------------------------------ data types
    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True

    def is_fp64_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        dtypes = [torch.float]
        if self.is_fp16_supported():
            dtypes.append(torch.half)
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes

    # ------------------------------------------------------------------ tensors
    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if torch.cuda.is_available() else tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if torch.cuda.is_available() else False

    def unpin_memory(self, tensor: torch.Tensor) -> None:
        """Nothing to release (DeepSpeed's answer for torch's pinned memory, which goes with the tensor): the
        accelerators pin through torch only."""
        return None

    # DeepSpeed's tensor constructors on this accelerator (get_accelerator().ByteTensor([1, 2]), ...).
    def _constructor(self, dtype: torch.dtype):
        return functools.partial(torch.tensor, dtype=dtype, device=self.device_name())

    ByteTensor = property(lambda self: self._constructor(torch.uint8))
    BoolTensor = property(lambda self: self._constructor(torch.bool))
    IntTensor = property(lambda self: self._constructor(torch.int32))
    LongTensor = property(lambda self: self._constructor(torch.int64))
    HalfTensor = property(lambda self: self._constructor(torch.float16))
    BFloat16Tensor = property(lambda self: self._constructor(torch.bfloat16))
    FloatTensor = property(lambda self: self._constructor(torch.float32))
    DoubleTensor = property(lambda self: self._constructor(torch.float64))

    # ------------------------------------------------------------------ communication, compilation
    def communication_backend_name(self) -> str:
        return self._communication_backend

    def is_triton_supported(self) -> bool:
        return False

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        self._compile_backend = backend

    def visible_devices_envs(self) -> list[str]:
        return []

    def set_visible_devices_envs(self, current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
        for name in self.visible_devices_envs():
            current_env[name] = ",".join(map(str, local_accelerator_ids))

    # ------------------------------------------------------------------ profiling marks
    def range_push(self, msg: str) -> None:
        pass

    def range_pop(self) -> None:
        pass

    def lazy_call(self, callback: Callable[[], Any]) -> Any:
        return callback()

    def __repr__(self) -> str:
        return f"<dstrain accelerator {self._name}>"


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


@contextlib.contextmanager
def _fork_rng(devices: Any = None, enabled: bool = True, _caller: str = "fork_rng",
              _devices_kw: str = "devices", device_type: str = "cuda") -> Iterator[None]:
    """torch.random.fork_rng, where device_type "cpu" means the CPU generator alone: torch always forks it, and
    has no `torch.cpu` generator to fork beside it (its own fork_rng fails there for want of get_rng_state)."""
    if device_type != "cpu":
        with torch.random.fork_rng(devices, enabled, _caller, _devices_kw, device_type):
            yield
        return
    if not enabled:
        yield
        return
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


_HOST_RANDOM = types.SimpleNamespace(**{name: getattr(torch.random, name) for name in dir(torch.random)
                                        if not name.startswith("__")})
_HOST_RANDOM.fork_rng = _fork_rng
