"""`dstp plan <model config.json>`: print how AutoTP would split a Hugging Face model, parameter by parameter.

    dstp plan config.json --tp 4                      # the model's own base_model_tp_plan, or its preset
    dstp plan config.json --ds-config ds_config.json  # tensor_parallel from a DeepSpeed config

The model is built on the meta device from its config (no weights are read or downloaded). Every
parameter no rule matches, and every one two rules match, is listed at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .errors import TensorParallelError

_MAX_CONFIG_BYTES = 16 * 1024 * 1024


def _read_json(path: str, what: str) -> dict[str, Any]:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise TensorParallelError(f"{what} {path}: no such file")
    if file.stat().st_size > _MAX_CONFIG_BYTES:
        raise TensorParallelError(f"{what} {file}: larger than {_MAX_CONFIG_BYTES} bytes; not a config")
    try:
        data = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorParallelError(f"{what} {file}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TensorParallelError(f"{what} {file}: expected a JSON object")
    return data


def skeleton(model_config: dict[str, Any]) -> Any:
    """The causal-LM of a Hugging Face config dict, on the meta device (shapes only)."""
    try:
        import torch
        import transformers
    except ImportError:
        raise TensorParallelError("dstp plan builds the model from its Hugging Face config: "
                                  "`pip install dstp[hf]` (transformers)") from None
    model_type = model_config.get("model_type")
    if not isinstance(model_type, str):
        raise TensorParallelError("the model config has no \"model_type\"; give the model's config.json")
    fields = {k: v for k, v in model_config.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise TensorParallelError(f"model_type {model_type!r}: transformers cannot build it ({exc})") from None
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dstp", description="AutoTP tensor parallelism tools")
    commands = parser.add_subparsers(dest="command", required=True)
    plan_cmd = commands.add_parser("plan", help="print every parameter of a model and how AutoTP splits it")
    plan_cmd.add_argument("model_config", help="the model's config.json (or its directory)")
    plan_cmd.add_argument("--ds-config", help="a DeepSpeed config whose tensor_parallel section to use")
    plan_cmd.add_argument("--tp", type=int, help="autotp_size (default: the DeepSpeed config's, else 2)")
    plan_cmd.add_argument("--preset", help="tensor_parallel.preset_model")
    plan_cmd.add_argument("--vocab-parallel-lm-head", action="store_true")
    args = parser.parse_args(argv)
    try:
        from .apply import plan_for

        section = None
        if args.ds_config:
            import dsconfig

            raw = _read_json(args.ds_config, "DeepSpeed config")
            try:
                section = dsconfig.load({"train_batch_size": 1, "tensor_parallel": raw.get("tensor_parallel", {})}
                                        ).tensor_parallel
            except dsconfig.ConfigError as exc:
                raise TensorParallelError(str(exc)) from None
        tp = args.tp or (section.autotp_size if section is not None and section.autotp_size > 1 else 2)
        model = skeleton(_read_json(args.model_config, "model config"))
        plan = plan_for(model, tp, preset_model=args.preset or (section.preset_model if section else None),
                        partition_config=section.partition_config if section else None,
                        vocab_parallel_lm_head=args.vocab_parallel_lm_head or bool(section and
                                                                                    section.vocab_parallel_lm_head))
    except TensorParallelError as exc:
        print(f"dstp plan: {exc}", file=sys.stderr)
        return 1
    print(plan.format())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
