"""ZeRO (the `zero_optimization` section) and its CPU/NVMe offload sub-sections."""

from typing import Any, Literal

import attrs

from ..fields import Auto, FieldInfo, section, setting

OffloadDevice = Literal["cpu", "nvme", "none"]


@attrs.frozen
class OffloadParamConfig:
    device: OffloadDevice = setting("cpu", "Where parameters are offloaded: cpu or nvme ('none' disables).")
    nvme_path: str = setting("/local_nvme", "File-system path for NVMe parameter offload.")
    pin_memory: bool = setting(True, "Offload to page-locked (pinned) CPU memory.")
    buffer_count: int = setting(5, "Buffers in the NVMe parameter-offload pool.", ge=1)
    buffer_size: int | Auto = setting(100_000_000, "Size (elements) of each NVMe parameter-offload buffer.", ge=1)
    max_in_cpu: int = setting(1_000_000_000, "Parameter elements kept in CPU memory under NVMe offload.", ge=0)

    @property
    def active(self) -> bool:
        return self.device != "none"


@attrs.frozen
class OffloadOptimizerConfig:
    device: OffloadDevice = setting("cpu", "Where optimizer state is offloaded: cpu or nvme ('none' disables).")
    nvme_path: str = setting("/local_nvme", "File-system path for NVMe optimizer-state offload.")
    pin_memory: bool = setting(True, "Offload to page-locked (pinned) CPU memory.")
    ratio: float = setting(1.0, "Fraction of parameters whose optimizer step runs on the CPU.", ge=0, le=1)
    buffer_count: int = setting(4, "Buffers in the NVMe optimizer-state pool (at least the states per parameter).", ge=1)
    fast_init: bool = setting(False, "Fast optimizer initialisation under NVMe offload.")
    pipeline_read: bool = setting(False, "Overlap reading the next sub-group's state with the optimizer step.")
    pipeline_write: bool = setting(False, "Overlap writing the previous sub-group's state with the optimizer step.")

    @property
    def active(self) -> bool:
        return self.device != "none"


# DeepSpeed's defaults: the Hugging Face MoE blocks whose experts a token may skip, so that stage 3 gathers the block
# whole at its forward instead of hooking each expert (a rank skipping an expert would wait on the others' gather).
DEFAULT_LEAF_MODULE_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)


def _names(value: list[str] | str) -> list[str]:
    """One name may be written as a string (DeepSpeed accepts it); repeats are dropped, order kept."""
    return list(dict.fromkeys([value] if isinstance(value, str) else value))


def _name_list(default: tuple[str, ...], doc: str) -> Any:
    return attrs.field(factory=lambda: list(default), converter=_names, metadata={"dsconfig": FieldInfo(doc)})


@attrs.frozen
class LeafModuleConfig:
    """Modules stage 3 gathers whole at their forward (dszero's z3 leaf modules), chosen by the config."""

    classes: list[str] | str = _name_list(
        DEFAULT_LEAF_MODULE_CLASSES, "Module classes (qualified names, or bare class names) that are leaves.")
    names: list[str] | str = _name_list((), "Module names (as named_modules() gives them) that are leaves.")
    name_suffixes: list[str] | str = _name_list((), "Modules whose name ends with one of these are leaves.")


@attrs.frozen
class ZeroConfig:
    stage: Literal[0, 1, 2, 3] = setting(0, "0 disabled, 1 optimizer states, 2 + gradients, 3 + parameters.")
    allgather_partitions: bool = setting(True, "Allgather (instead of broadcasts) of updated partitions after each step.")
    allgather_bucket_size: int | Auto = setting(500_000_000, "Elements allgathered at a time.", ge=1)
    compute_grad_norm: bool = setting(True, "Compute and keep the global gradient norm in ZeRO 1/2 steps.")
    overlap_comm: bool = setting(False, "Overlap gradient reduction with the backward pass.")
    reduce_scatter: bool = setting(True, "Reduce-scatter (instead of allreduce) to average gradients.")
    reduce_bucket_size: int | Auto = setting(500_000_000, "Elements reduced at a time.", ge=1)
    contiguous_gradients: bool = setting(True, "Copy gradients into a contiguous buffer as they are produced.")
    load_from_fp32_weights: bool = setting(True, "Initialise master weights from the checkpoint's fp32 copies.")
    round_robin_gradients: bool = setting(False, "Parallelise gradient copies to CPU among ranks (ZeRO 1/2 offload).")
    parameter_alignment: bool = setting(False, "Pad ZeRO 1/2 flat buffers so every parameter is 16-byte aligned.")
    offload_param: OffloadParamConfig | None = setting(None, "Offload parameters to CPU or NVMe (stage 3).")
    offload_optimizer: OffloadOptimizerConfig | None = setting(
        None, "Offload optimizer state and step to CPU (stages 1-3) or NVMe (stage 3).")
    stage3_max_live_parameters: int | Auto = setting(1_000_000_000, "Parameters resident per rank before release.", ge=0)
    stage3_max_reuse_distance: int | Auto = setting(
        1_000_000_000, "Keep a parameter if it is reused within this many parameters.", ge=-1)
    stage3_prefetch_bucket_size: int | Auto = setting(500_000_000, "Elements of the parameter prefetch buffer.", ge=0)
    stage3_param_persistence_threshold: int | Auto = setting(
        100_000, "Parameters smaller than this are not partitioned.", ge=0)
    sub_group_size: int | Auto = setting(1_000_000_000, "Parameters updated per optimizer sub-group.", ge=0)
    stage3_gather_16bit_weights_on_model_save: bool = setting(
        False, "Gather 16-bit weights for save_16bit_model() under stage 3.")
    stage3_module_granularity_threshold: int = setting(
        0, "Modules finer than this are fetched as one unit under stage 3.", ge=0)
    ignore_unused_parameters: bool = setting(True, "Tolerate parameters that receive no gradient.")
    zero_hpz_partition_size: int = setting(1, "Ranks in the hpZ secondary partition group of ZeRO++.", ge=1)
    zero_quantized_weights: bool = setting(False, "ZeRO++ quantized weight communication.")
    zero_quantized_gradients: bool = setting(False, "ZeRO++ quantized gradient communication.")
    log_trace_cache_warnings: bool = setting(False, "Log parameter trace-cache warnings of stage 3.")
    save_muon_momentum_buffer_in_memory: bool = setting(
        False, "Keep the Muon momentum buffer in memory under stage-3 NVMe offload.")
    leaf_module: LeafModuleConfig = section(LeafModuleConfig, "Modules gathered whole at their forward under stage 3.")

    @property
    def param_offload_device(self) -> str:
        return self.offload_param.device if self.offload_param else "none"

    @property
    def optimizer_offload_device(self) -> str:
        return self.offload_optimizer.device if self.offload_optimizer else "none"
