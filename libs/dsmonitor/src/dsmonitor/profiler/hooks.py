"""Attributing counted flops and wall time to modules.

torch's FlopCounterMode counts every matmul / conv / attention op dispatched while it is active.
Forward hooks read its running total before and after each module, so a module gets exactly the
flops of the ops run inside it, functional calls included, with no function patched by hand.
"""

import time

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from .._device import synchronize
from .stats import ModuleStats


def trainable_params(module: torch.nn.Module) -> int:
    # DeepSpeed counts parameters that require grad; frozen ones are left out.
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _sdpa_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


_sdpa_flops._get_raw = True  # FlopCounterMode then passes the tensors, not their shapes


def _native_mha_flops(query, key, value, embed_dim, *args, out_val=None, **kwargs) -> int:
    """nn.MultiheadAttention's inference fast path: projections, scores, mix, output projection."""
    e = int(embed_dim)
    batch = query.shape[0] if query.dim() == 3 else 1
    n_q, n_k = query.numel() // e, key.numel() // e  # tokens, all batches
    macs = n_q * e * e + 2 * n_k * e * e + 2 * batch * (n_q // batch) * (n_k // batch) * e + n_q * e * e
    return 2 * macs


_native_mha_flops._get_raw = True


def _missing_formulas() -> dict:
    """Ops torch's registry leaves at zero although their flops are known."""
    aten = torch.ops.aten
    extra = {}
    # The fused CPU attention kernel: the same two matmuls as every other SDPA backend.
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_flops
    # One fused op (no decomposition) that would otherwise count zero.
    if hasattr(aten, "_native_multi_head_attention"):
        extra[aten._native_multi_head_attention] = _native_mha_flops
    return extra


class ModuleAccounting:
    """While active: counts flops with FlopCounterMode and times each hooked module's forward."""

    def __init__(self, model: torch.nn.Module, ignore_types: tuple[type, ...] = ()) -> None:
        self.counter = FlopCounterMode(display=False, custom_mapping=_missing_formulas())
        self.stats: dict[torch.nn.Module, ModuleStats] = {}
        for name, module in model.named_modules():
            if name and isinstance(module, ignore_types):
                continue  # its flops still count towards its parents
            self.stats[module] = ModuleStats(
                name=name, type_name=type(module).__name__, depth=name.count(".") + 1 if name else 0,
                params=trainable_params(module))
        self._open: dict[torch.nn.Module, list[tuple[int, float]]] = {}
        self._handles: list = []

    def total_flops(self) -> int:
        return sum(self.counter.flop_counts["Global"].values())

    def _before(self, module, _inputs) -> None:
        synchronize()
        self._open.setdefault(module, []).append((self.total_flops(), time.perf_counter()))

    def _after(self, module, _inputs, _output) -> None:
        synchronize()
        end = time.perf_counter()
        flops0, start = self._open[module].pop()
        stats = self.stats[module]
        flops = self.total_flops() - flops0
        stats.flops += flops
        stats.macs += flops // 2  # every op torch counts is a multiply-accumulate (2 flops each)
        stats.duration += end - start
        stats.calls += 1

    def start(self) -> None:
        for module in self.stats:
            self._handles.append(module.register_forward_pre_hook(self._before))
            self._handles.append(module.register_forward_hook(self._after))
        self.counter.__enter__()

    def stop(self) -> None:
        self.counter.__exit__(None, None, None)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._open.clear()

    def reset(self) -> None:
        for stats in self.stats.values():
            stats.flops = stats.macs = stats.calls = 0
            stats.duration = 0.0
