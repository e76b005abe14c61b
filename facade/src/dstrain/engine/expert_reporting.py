"""Expert loads to the monitors, when the script asks: `report_expert_counts(engine)` after a step.

DeepSpeed returns each MoE layer's exp_counts from forward and leaves them to the script; here one
call sums every layer's last counts over the data-parallel ranks and writes them as monitor events
(TensorBoard, CSV, W&B, Comet: whatever the config's monitors are), one per layer and expert.
"""

from __future__ import annotations

from typing import Any

import torch

import dscomm
import dsmoe

EVENT_PREFIX = "Train/Samples/moe"


def expert_count_event(layer: int, expert: int) -> str:
    return f"{EVENT_PREFIX}/layer_{layer}/expert_{expert}_tokens"


def report_expert_counts(engine: Any, counts: list[torch.Tensor] | None = None) -> list[tuple[str, float, int]]:
    """Write the tokens each expert was routed in the last forward (`counts`: one tensor per MoE layer,
    default each layer's last exp_counts), summed over the data-parallel ranks, at the engine's sample
    count. Collective over the data-parallel group: call it on every rank. Returns the events."""
    layers = dsmoe.moe_layers(engine.module)
    if counts is None:
        counts = [layer.deepspeed_moe.exp_counts for _, layer in layers]
    if len(counts) != len(layers) or any(c is None for c in counts):
        raise ValueError(f"report_expert_counts: {len(layers)} MoE layer(s) but {len(counts)} count tensor(s) "
                         f"(None before a layer's first forward); give one per layer, in module order")
    total = torch.cat([c.detach().reshape(-1).to(torch.float64).cpu() for c in counts])
    dscomm.all_reduce(total, group=engine.data_parallel_group, log_name="moe_expert_counts")
    step = engine.global_samples
    events, position = [], 0
    for layer_id, count in enumerate(counts):
        for expert in range(count.numel()):
            events.append((expert_count_event(layer_id, expert), float(total[position]), step))
            position += 1
    monitor = engine.reporter.monitor
    if monitor.enabled:
        monitor.write_events(events)
    return events
