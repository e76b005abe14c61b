"""A short list of what a config turns on, for `dsconfig check` and banners."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import DeepSpeedConfig


def enabled_features(cfg: DeepSpeedConfig) -> list[str]:
    zero = cfg.zero_optimization
    features = []
    if zero.stage:
        features.append(f"ZeRO stage {zero.stage}")
    if zero.optimizer_offload_device != "none":
        features.append(f"optimizer offload to {zero.optimizer_offload_device}")
    if zero.param_offload_device != "none":
        features.append(f"parameter offload to {zero.param_offload_device}")
    zeropp = [name for name, on in (("hpZ", zero.zero_hpz_partition_size > 1), ("qwZ", zero.zero_quantized_weights),
                                     ("qgZ", zero.zero_quantized_gradients)) if on]
    if zeropp:
        features.append(f"ZeRO++ ({', '.join(zeropp)})")
    for name, flag in (("fp16", cfg.fp16.enabled), ("bf16", cfg.bf16.enabled)):
        if flag is True:
            features.append(name)
        elif flag == "auto":
            features.append(f"{name} (auto)")
    if cfg.torch_autocast.enabled:
        features.append(f"torch.autocast ({cfg.torch_autocast.dtype})")
    if cfg.optimizer is not None:
        features.append(f"optimizer {cfg.optimizer.type}")
    if cfg.scheduler is not None:
        features.append(f"scheduler {cfg.scheduler.type}")
    if cfg.gradient_clipping not in (0, 0.0):
        features.append(f"gradient clipping {cfg.gradient_clipping}")
    if cfg.tensor_parallel.autotp_size > 1:
        features.append(f"AutoTP size {cfg.tensor_parallel.autotp_size}")
    if cfg.expert_parallel.enabled:
        features.append(f"AutoEP size {cfg.expert_parallel.autoep_size}")
    if cfg.sequence_parallel_size > 1:
        features.append(f"sequence parallel size {cfg.sequence_parallel_size}")
    if cfg.activation_checkpointing.partition_activations or cfg.activation_checkpointing.cpu_checkpointing:
        features.append("activation checkpointing")
    de = cfg.data_efficiency  # each technique runs from its own enabled key, as in DeepSpeed
    if de.data_sampling.curriculum_learning.enabled:
        features.append("curriculum learning")
    if de.data_routing.random_ltd.enabled:
        features.append("random-LTD")
    if cfg.curriculum_learning.enabled:
        features.append(f"legacy {cfg.curriculum_learning.curriculum_type} curriculum")
    for name in ("tensorboard", "wandb", "comet", "csv_monitor", "comms_logger", "flops_profiler", "hybrid_engine",
                 "autotuning"):
        if getattr(cfg, name).enabled:
            features.append(name)
    if cfg.compile.deepcompile:
        features.append("DeepCompile")
    if cfg.wall_clock_breakdown:
        features.append("wall-clock breakdown")
    return features
