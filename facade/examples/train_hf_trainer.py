"""Train a small Hugging Face Llama with transformers' Trainer and `TrainingArguments(deepspeed=...)`, on dstrain.

    pip install ./deepspeed-compat accelerate        # opt-in: `import deepspeed` and its metadata become dstrain's
    deepspeed --num_gpus 2 facade/examples/train_hf_trainer.py --deepspeed facade/examples/configs/hf_trainer_zero2.json

Nothing here names dstrain: this is a plain Trainer script, as Hugging Face's examples write it. With the opt-in
deepspeed-compat package installed, transformers and Accelerate find "DeepSpeed" (dstrain, through the package's
import hook and metadata), fill the config's "auto" values from the TrainingArguments and train through dstrain's
engine; the `deepspeed` command is dstrain's launcher. The model is LlamaForCausalLM built from a config
(nothing is downloaded), reading the Python standard library's source as characters.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from text_corpus import CharWindows, stdlib_bytes


class CausalLMWindows(torch.utils.data.Dataset):
    """The Trainer's shape of a causal-LM example: each window its own labels (the model shifts them)."""

    def __init__(self, windows: CharWindows):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.windows[index]
        return {"input_ids": window, "labels": window}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--deepspeed", required=True, help="the DeepSpeed config (TrainingArguments' deepspeed=)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (max_steps)")
    parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--seq", type=int, default=128, help="characters of context")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--out", default="runs/train_hf_trainer", help="the Trainer's output_dir")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        # Accelerate picks a process-group backend only where it finds an accelerator (nccl on GPUs): on CPUs
        # the script names gloo, and the Trainer takes this state (accelerator_config below).
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        from accelerate import PartialState

        PartialState(backend="gloo")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    train_data = CausalLMWindows(CharWindows(text[:split], args.seq))
    eval_data = CausalLMWindows(CharWindows(text[split:], args.seq))
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=args.seq + 1, tie_word_embeddings=False,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    transformers.set_seed(1234)
    model = transformers.LlamaForCausalLM(config)

    training_args = transformers.TrainingArguments(
        output_dir=args.out, deepspeed=args.deepspeed, per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.batch, max_steps=args.steps, learning_rate=3e-3, warmup_steps=args.steps // 10,
        lr_scheduler_type="linear", max_grad_norm=1.0, logging_steps=max(args.steps // 4, 1), eval_strategy="no",
        save_strategy="no", report_to=[], disable_tqdm=True, accelerator_config={"use_configured_state": True})
    trainer = transformers.Trainer(model=model, args=training_args, train_dataset=train_data,
                                   eval_dataset=torch.utils.data.Subset(eval_data, range(min(64, len(eval_data)))))
    result = trainer.train()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        engine = type(trainer.deepspeed)
        print(f"trained {result.global_step} steps with {engine.__module__}.{engine.__name__}, ZeRO stage "
              f"{trainer.deepspeed.zero_optimization_stage()}: mean train loss {result.training_loss:.3f}, "
              f"eval loss {metrics['eval_loss']:.3f}", flush=True)


if __name__ == "__main__":
    main()
