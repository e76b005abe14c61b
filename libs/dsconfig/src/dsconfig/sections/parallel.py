"""Parallelism beyond data parallel: AutoTP, AutoEP, the hybrid engine and pipeline settings."""

from typing import Literal

import attrs

from ..fields import Auto, section, setting


@attrs.frozen
class TPLayerSpec:
    patterns: list[str] = section(list, "Regexes of the parameter names this rule applies to.")
    partition_type: Literal["row", "column", "skip"] = setting("column", "How matching parameters are split.")
    shape: list[int | list[int]] | None = setting(
        None, "Sub-parameter shape of fused weights before splitting, e.g. [2, -1]; [[q, k, v], -1] for unequal parts.")
    partition_dim: int | None = setting(None, "Dimension to split when shape is given.")
    model_types: list[str] | None = setting(None, "model.config.model_type values this rule is limited to.")


@attrs.frozen
class TPPartitionConfig:
    use_default_specs: bool = setting(True, "Merge layer_specs with the preset's defaults.")
    layer_specs: list[TPLayerSpec] = section(list, "Ordered partitioning rules.")


TPPreset = Literal["llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3"]


@attrs.frozen
class TensorParallelConfig:
    autotp_size: int = setting(0, "Tensor-parallel degree; 0 disables AutoTP.", ge=0)
    preset_model: TPPreset | None = setting(None, "Built-in partitioning preset.")
    tp_overlap_comm: bool = setting(False, "Overlap tensor-parallel allreduce with computation.")
    vocab_parallel_lm_head: bool = setting(False, "Keep an untied lm_head sharded over the vocabulary.")
    partition_config: TPPartitionConfig | None = setting(None, "Custom partitioning rules.")


@attrs.frozen
class HybridEngineConfig:
    enabled: bool = setting(False, "Switch the model between training and inference kernels.")
    max_out_tokens: int = setting(512, "Maximum tokens generated.", ge=1)
    inference_tp_size: int = setting(1, "Tensor-parallel degree of generation.", ge=1)
    release_inference_cache: bool = setting(False, "Free inference buffers after each generation.")
    pin_parameters: bool = setting(True, "Pin parameters in memory during generation.")
    tp_gather_partition_size: int = setting(8, "Layers gathered at a time for tensor-parallel generation.", ge=1)
    enable_cuda_graph: bool = setting(False, "Capture token generation into CUDA graphs.")


EPPreset = Literal["mixtral", "qwen3_moe", "qwen3_5_moe", "deepseek_v2", "deepseek_v3"]
_UNSET = "<preset default>"  # expert_w3: absent keeps the preset's name; null means fused gate+up


@attrs.frozen
class ExpertParallelConfig:
    enabled: bool = setting(False, "Enable AutoEP; when false every other key is ignored.")
    autoep_size: int = setting(1, "Expert-parallel degree; must divide world_size / pp_size.", ge=1)
    expert_tensor_parallel_size: int = setting(1, "Reserved; only 1 is accepted.", ge=1)
    async_split_plan: bool = setting(False, "Overlap the split-metadata copy with token packing (CUDA).")
    preset_model: EPPreset | None = setting(None, "Built-in MoE detection preset.")
    use_grouped_mm: bool = setting(True, "Fused grouped GEMM for the experts.")
    disable_triton_grouped_mm: bool = setting(False, "Force torch._grouped_mm instead of the Triton kernel.")
    moe_layer_pattern: str | None = setting(None, "Regex of MoE module names.")
    router_pattern: str | None = setting(None, "Child attribute name of the router.")
    expert_pattern: str | None = setting(None, "Child attribute name of the experts module.")
    score_func: Literal["softmax", "sigmoid", "auto"] = setting("auto", "Router scoring function.")
    score_apply: Literal["pre", "post", "auto"] = setting("auto", "Apply router scores before experts or at combine.")
    combine_impl: Literal["auto", "weighted_sum", "fused_weighted_sum", "legacy_bmm"] = setting(
        "auto", "How expert outputs are weighted and reduced over top-k.")
    route_norm: bool | None = setting(None, "Renormalise top-k scores; null auto-detects.")
    route_scale: float = setting(1.0, "Scale applied to router scores.")
    top_k: int | Auto = setting("auto", "Experts per token; auto reads model.config via top_k_attr.", ge=1,
                                 auto_is_mode=True)
    routed_scaling_factor: float | Auto = setting("auto", "Scale of routed expert outputs; auto detects.",
                                                auto_is_mode=True)
    num_expert_groups: int | None = setting(None, "Expert groups of group-limited routing.", ge=1)
    num_limited_groups: int | None = setting(None, "Groups selected per token; at most num_expert_groups.", ge=1)
    load_balance_coeff: None = setting(None, "Reserved; must be null.")
    expert_w1: str | None = setting(None, "Gate (or fused gate+up) weight name.")
    expert_w2: str | None = setting(None, "Down-projection weight name.")
    expert_w3: str | None = setting(_UNSET, "Up-projection weight name; null means fused gate+up.")
    num_experts_attr: str | None = setting(None, "model.config attribute holding the expert count.")
    top_k_attr: str | None = setting(None, "model.config attribute holding top-k.")
    has_shared_experts: bool | None = setting(None, "The layer has shared experts; null auto-detects.")
    shared_experts_pattern: str | None = setting(None, "Child attribute name of the shared experts.")
    shared_experts_gate_pattern: str | None = setting(None, "Child attribute name of the shared-experts gate.")

    @property
    def expert_w3_from_preset(self) -> bool:
        return self.expert_w3 == _UNSET


# dspipe's training schedules (dsconfig imports no library, so the names are listed here too).
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"]


@attrs.frozen
class PipelineConfig:
    stages: int | Auto = setting("auto", "Pipeline stages; auto takes the PipelineModule's num_stages.", ge=1,
                                   auto_is_mode=True)
    partition: str = setting("best", "Layer partitioning; the PipelineModule's partition_method takes precedence.")
    seed_layers: bool = setting(False, "Seed each layer with its own seed.")
    activation_checkpoint_interval: int = setting(0, "Checkpoint activations every N layers; 0 disables.", ge=0)
    pipe_partitioned: bool = setting(True, "Partition activations sent between stages over the tensor-parallel group.")
    grad_partitioned: bool = setting(True, "Partition gradients sent between stages over the tensor-parallel group.")
    use_reentrant: bool = setting(True, "Use reentrant activation checkpointing.")
    schedule: PipelineSchedule = setting(
        "1f1b", "Training schedule: 1f1b (DeepSpeed's), gpipe, interleaved_1f1b (a PipelineModule with chunks > 1), "
                "zb_h1 (zero bubble), zbv or dualpipev (a DualPipeVModule, which picks dualpipev when the key is "
                "absent).")
