"""Memory needed for model states under ZeRO, per device and per host, for each offload option.

Mixed-precision training with Adam, as the ZeRO paper counts it: 2 bytes per parameter of 16-bit
weights, 2 of 16-bit gradients, K = 12 of optimizer state (fp32 master weights, momentum,
variance), plus 4 bytes of fp32 gradient per parameter where the optimizer step runs on the host.
Psi parameters, N devices in all, L the largest layer's parameters (stage 3 gathers one layer's
weights and gradients at a time). Host memory also holds each process's copy of the model while
it is built (4 bytes per parameter per device of the node, unless it is built partitioned with
`zero_init`), with a 1.5x margin for allocator slack and buffers, as DeepSpeed's estimators use.
"""

from __future__ import annotations

import attrs
import torch

HOST_MARGIN = 1.5


@attrs.frozen
class Estimate:
    options: str
    per_device_bytes: int
    per_host_bytes: int


def model_sizes(model: torch.nn.Module) -> tuple[int, int]:
    """(total parameters, parameters of the largest module counting only its own)."""
    total = sum(p.numel() for p in model.parameters())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return total, largest


def zero2_estimates(total: int, num_gpus_per_node: int = 1, num_nodes: int = 1) -> list[Estimate]:
    n = num_gpus_per_node * num_nodes
    host_model = 4 * total * num_gpus_per_node
    return [
        Estimate("offload_optimizer=cpu", 2 * total + 2 * total // n,
                 int(HOST_MARGIN * (host_model + 16 * total * num_gpus_per_node // n))),
        Estimate("offload_optimizer=none", 2 * total + 14 * total // n, int(HOST_MARGIN * host_model)),
    ]


def zero3_estimates(total: int, largest: int, num_gpus_per_node: int = 1, num_nodes: int = 1) -> list[Estimate]:
    n = num_gpus_per_node * num_nodes
    gathered = 4 * largest  # one layer's 16-bit weights and gradients, whole
    rows = []
    for param_cpu in (True, False):
        for optim_cpu in (True, False):
            if param_cpu and not optim_cpu:
                continue  # parameter offload needs optimizer offload (as in DeepSpeed)
            for zero_init in (True, False):
                device = gathered + (0 if param_cpu else 4 * total // n) + (0 if optim_cpu else 12 * total // n)
                host = (4 * total // n if param_cpu else 0) + (16 * total // n if optim_cpu else 0)
                host = host * num_gpus_per_node + (0 if zero_init else 4 * total * num_gpus_per_node)
                rows.append(Estimate(f"offload_param={'cpu' if param_cpu else 'none'}, "
                                     f"offload_optimizer={'cpu' if optim_cpu else 'none'}, zero_init={int(zero_init)}",
                                     device, int(HOST_MARGIN * host)))
    return rows


def _print(stage: int, total: int, largest: int | None, rows: list[Estimate], gpus: int, nodes: int) -> None:
    print(f"Estimated memory for params, optimizer states and gradients (ZeRO-{stage}):")
    print(f"HW: {nodes} node(s), {gpus} GPU(s) per node.")
    layer = f", largest layer {largest / 1e6:.0f}M" if largest is not None else ""
    print(f"SW: model with {total / 1e6:.0f}M total params{layer}.")
    print(f"  {'per CPU':>10} | {'per GPU':>10} | options")
    for row in rows:
        print(f"  {row.per_host_bytes / 2**30:>7.2f}GB | {row.per_device_bytes / 2**30:>7.2f}GB | {row.options}")


def estimate_zero2_model_states_mem_needs_all_live(model: torch.nn.Module, num_gpus_per_node: int = 1,
                                                   num_nodes: int = 1) -> list[Estimate]:
    total, _ = model_sizes(model)
    rows = zero2_estimates(total, num_gpus_per_node, num_nodes)
    _print(2, total, None, rows, num_gpus_per_node, num_nodes)
    return rows


def estimate_zero3_model_states_mem_needs_all_live(model: torch.nn.Module, num_gpus_per_node: int = 1,
                                                   num_nodes: int = 1) -> list[Estimate]:
    total, largest = model_sizes(model)
    rows = zero3_estimates(total, largest, num_gpus_per_node, num_nodes)
    _print(3, total, largest, rows, num_gpus_per_node, num_nodes)
    return rows


def estimate_zero2_model_states_mem_needs_all_cold(total_params: int, num_gpus_per_node: int = 1,
                                                   num_nodes: int = 1) -> list[Estimate]:
    """The same from a parameter count, without building the model."""
    rows = zero2_estimates(total_params, num_gpus_per_node, num_nodes)
    _print(2, total_params, None, rows, num_gpus_per_node, num_nodes)
    return rows


def estimate_zero3_model_states_mem_needs_all_cold(total_params: int, largest_layer_params: int,
                                                   num_gpus_per_node: int = 1, num_nodes: int = 1) -> list[Estimate]:
    rows = zero3_estimates(total_params, largest_layer_params, num_gpus_per_node, num_nodes)
    _print(3, total_params, largest_layer_params, rows, num_gpus_per_node, num_nodes)
    return rows
