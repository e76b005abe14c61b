"""The corpus of real DeepSpeed configs (corpus/, copied from shared/corpus/ds_configs) and what each must do.

Every file loads with strict=False at the data-parallel size it was written for, except the
refusals listed in REFUSED, each with its reason. `python corpus_cases.py` rewrites the warning
snapshot (corpus_expectations.json) after a deliberate change; the test then holds it stable.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

HERE = Path(__file__).parent
CORPUS = HERE / "corpus"
EXPECTATIONS = HERE / "corpus_expectations.json"

# Data-parallel sizes the files were written for, where 8 does not divide their batch triple.
WORLD_SIZE = {
    "deepspeedai__DeepSpeedExamples__benchmarks__autosp__configs__autosp_config.json": 1,
    "deepspeedai__DeepSpeedExamples__inference__sglang__ds_offload_nvme_gds.json": 1,
    "microsoft__DeepSpeedExamples__Megatron-LM__scripts__ds_zero-offload_150B_config.json": 4,
    "microsoft__DeepSpeedExamples__compression__bert__config__ds_config.json": 1,
    "microsoft__DeepSpeedExamples__compression__cifar__config__ds_config_channel_prune.json": 1,
    "microsoft__DeepSpeedExamples__random_ltd__gpt_finetuning__config__ds_config.json": 2,
    "microsoft__DeepSpeedExamples__training__data_efficiency__gpt_finetuning__config__ds_config_gpt_base_random_ltd.json": 2,
    "microsoft__Megatron-DeepSpeed__ds_config-gpt.json": 1,
    "microsoft__Megatron-DeepSpeed__ds_config.json": 1,
    "microsoft__Megatron-DeepSpeed__examples__ds_config.json": 4,
    "microsoft__Megatron-DeepSpeed__examples_deepspeed__universal_checkpointing__ds_config.json": 1,
}
DEFAULT_WORLD_SIZE = 8

# Files that are not runnable configs as they stand: the error paths, and why.
REFUSED = {
    "deepspeedai__DeepSpeed__deepspeed__autotuning__tests__ds_config.json": (
        ["zero_optimization.stage", "zero_optimization.overlap_comm", "zero_optimization.reduce_bucket_size",
         "autotuning.results_dir", "autotuning.exps_dir"],
        "an autotuning search-space template: lists of candidates for overlap_comm and reduce_bucket_size, "
        "stage as the string \"1\", null for directory names"),
    "microsoft__DeepSpeedExamples__autotuning__ds_config.json": (
        ["train_micro_batch_size_per_gpu"],
        "an autotuning search-space template: train_micro_batch_size_per_gpu is the list [8]"),
    "microsoft__Megatron-DeepSpeed__ds_zero2_config_bf16.json": (
        ["communication_data_type"],
        "communication_data_type \"bfp16\" is not a data type (fp32, fp16 or bf16)"),
}

# Not JSON as stored (comments, template placeholders, a repeated key): read as Hjson, as DeepSpeed reads them. The
# ones listed load; the others are refused naming their keys (unfilled placeholders, invalid values, the repeat).
NONSTRICT = sorted(p.name for p in (CORPUS / "nonstrict").glob("*.json"))
NONSTRICT_LOADS = {"deepspeedai__DeepSpeedExamples__claude_tutorials__annotated_configs__zero3_nvme_offload_annotated.json"}


def corpus_files() -> list[str]:
    return sorted(p.name for p in CORPUS.glob("*.json"))


def observe(name: str) -> dict:
    """What loading one corpus file does: outcome, error paths, warnings."""
    import dsconfig

    world_size = WORLD_SIZE.get(name, DEFAULT_WORLD_SIZE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            dsconfig.load(CORPUS / name, world_size=world_size, strict=False)
            outcome, paths = "loads", []
        except dsconfig.ConfigError as exc:
            outcome, paths = "refused", exc.paths
    return {"world_size": world_size, "outcome": outcome, "error_paths": paths,
            "warnings": [str(w.message) for w in caught if issubclass(w.category, dsconfig.ConfigWarning)]}


if __name__ == "__main__":
    snapshot = {name: observe(name) for name in corpus_files()}
    EXPECTATIONS.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
    print(f"wrote {EXPECTATIONS} ({len(snapshot)} files)")
