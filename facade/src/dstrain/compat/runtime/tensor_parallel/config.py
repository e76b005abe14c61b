"""`deepspeed.runtime.tensor_parallel.config`: `_get_hf_tp_plan(model)`, the tensor-parallel plan a Hugging Face
model carries (its config's base_model_tp_plan with the model-level entries, lm_head, transformers keeps on the
model), which AutoTP splits the model by when no preset or partition_config is given: dstp.hf_tp_plan."""

from dstp import hf_tp_plan as _get_hf_tp_plan

__all__ = ["_get_hf_tp_plan"]
