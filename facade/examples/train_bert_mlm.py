"""Pre-train a small BERT (masked-LM) on the Python standard library's source, as characters, with dstrain.

    dstrain --num_procs 2 facade/examples/train_bert_mlm.py --deepspeed_config facade/examples/configs/bert_mlm.json \
        --deepspeed_transformer_kernel --attention_dropout_checkpoint

--deepspeed_transformer_kernel builds the encoder from DeepSpeedTransformerLayer, as DeepSpeed's transformer
kernel tutorial does; without it the same pre-LN math runs as plain torch.nn layers. The memory flags
(--normalize_invertible, --attention_dropout_checkpoint, --gelu_checkpoint) need the kernel. A config with
a sparse_attention section is refused beside the kernel, as the tutorial says.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import dstrain as deepspeed
from dstrain.ops.transformer import (
    DeepSpeedTransformerConfig,
    count_saved_activations,
    refuse_sparse_attention,
)

sys.path.insert(0, str(Path(__file__).parent))
from bert_model import BertMLM, MaskedChars
from evaluation import evaluate
from progress import ProgressBar
from text_corpus import CharWindows, stdlib_bytes

MEMORY_FLAGS = ("normalize_invertible", "attention_dropout_checkpoint", "gelu_checkpoint")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--seq", type=int, default=128, help="characters per sequence")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1, help="attention and hidden dropout")
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--deepspeed_transformer_kernel", action="store_true",
                        help="build the encoder from DeepSpeedTransformerLayer")
    parser.add_argument("--normalize_invertible", action="store_true", help="kernel: drop LayerNorm inputs")
    parser.add_argument("--attention_dropout_checkpoint", action="store_true",
                        help="kernel: recompute the attention dropout instead of storing it")
    parser.add_argument("--gelu_checkpoint", action="store_true", help="kernel: recompute GeLU instead of storing it")
    args = deepspeed.add_config_arguments(parser).parse_args()
    chosen = [f"--{flag}" for flag in MEMORY_FLAGS if getattr(args, flag)]
    if chosen and not args.deepspeed_transformer_kernel:
        parser.error(f"{', '.join(chosen)} configure the transformer kernel; add --deepspeed_transformer_kernel")
    return args


def kernel_config(args, micro_batch: int, fp16: bool, rank: int) -> DeepSpeedTransformerConfig:
    """The tutorial's DeepSpeedTransformerConfig, sized for this model; each rank its own dropout seed."""
    return DeepSpeedTransformerConfig(
        batch_size=micro_batch, hidden_size=args.hidden, intermediate_size=4 * args.hidden, heads=args.heads,
        attn_dropout_ratio=args.dropout, hidden_dropout_ratio=args.dropout, num_hidden_layers=args.layers,
        initializer_range=0.02, local_rank=max(args.local_rank, 0), seed=args.seed + rank, fp16=fp16, pre_layer_norm=True,
        attn_dropout_checkpoint=args.attention_dropout_checkpoint, normalize_invertible=args.normalize_invertible,
        gelu_checkpoint=args.gelu_checkpoint)


def main() -> None:
    args = parse_args()
    ds_config = json.loads(Path(args.deepspeed_config).read_text()) if args.deepspeed_config else {}
    if args.deepspeed_transformer_kernel:
        refuse_sparse_attention(ds_config, source=args.deepspeed_config)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    deepspeed.init_distributed()
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(args.seed)

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    train_data = MaskedChars(CharWindows(text[:split], args.seq), args.seq, seed=args.seed)
    val_data = MaskedChars(CharWindows(text[split:], args.seq), args.seq, seed=args.seed + 1)
    micro = ds_config.get("train_micro_batch_size_per_gpu", 8)
    config = kernel_config(args, micro, ds_config.get("fp16", {}).get("enabled", False), rank) \
        if args.deepspeed_transformer_kernel else None
    model = BertMLM(args.seq, args.hidden, args.layers, args.heads, args.dropout, kernel_config=config)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=train_data)
    if rank == 0:
        kind = "DeepSpeedTransformerLayer" if config else "torch.nn BertLayer"
        flags = [flag for flag in MEMORY_FLAGS if getattr(args, flag)]
        print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {args.layers} x {kind}"
              f"{' with ' + ', '.join(flags) if flags else ''}; {len(train_data)} training sequences", flush=True)

    batches = deepspeed.RepeatingLoader(loader)
    bar = ProgressBar(args.steps, enabled=rank == 0)
    losses, began = [], time.perf_counter()
    while engine.global_steps < args.steps:
        step_loss = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            batch = next(batches).to(engine.device)  # the loader yields CPU tensors
            if engine.global_steps == 0 and rank == 0:  # what the layers keep for backward, once
                with count_saved_activations(model.parameters()) as saved:
                    loss = engine(batch)
                print(f"activations saved for backward: {saved.bytes / 2**20:.2f} MiB per micro-batch", flush=True)
            else:
                loss = engine(batch)
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / engine.gradient_accumulation_steps()
        losses.append(step_loss)
        bar.update(engine.global_steps, step_loss, engine.train_batch_size())
    bar.close()
    val = evaluate(engine, val_data)
    if rank == 0:
        window = min(10, len(losses))
        print(f"trained {engine.global_steps} steps in {time.perf_counter() - began:.0f} s; masked-LM loss "
              f"{sum(losses[:window]) / window:.3f} -> {sum(losses[-window:]) / window:.3f} (mean of {window} "
              f"steps); validation loss {val:.3f}", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
