"""Train a small Hugging Face Llama on long windows with Ulysses sequence parallelism (DeepSpeed's Ulysses and
Arctic Long Sequence Training tutorials), with dstrain.

    dstrain --num_procs 2 facade/examples/train_llama_ulysses.py --deepspeed_config facade/examples/configs/ulysses_sp2.json

Each window of --seq characters is cut over the `sequence_parallel_size` ranks: every rank embeds, projects and
runs the MLP on its slice only, and attention sees the whole sequence because Ulysses exchanges it by heads
(two all-to-alls around transformers' "sdpa" attention, registered by `register_with_transformers`). The
engine's loader gives the sequence ranks of a replica the same windows; `shard_batch` cuts them (the labels
shifted over the whole window first, so no boundary loses its target) and `sequence_parallel_loss` is the
whole window's mean on every rank. ZeRO partitions over sequence x data ranks (2 processes: 1 data replica).
The model is LlamaForCausalLM built from a config (nothing is downloaded), on the Python standard library's
source as characters. Written as a DeepSpeed script would be (`import dstrain as deepspeed`), with dsseq's two helpers for the slice
and the loss (DeepSpeed's tutorial writes them out by hand).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers

import dsseq
import dstrain as deepspeed
from dstrain.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
from dstrain.utils import groups

sys.path.insert(0, str(Path(__file__).parent))
from evaluation import evaluate
from progress import ProgressBar
from text_corpus import CharWindows, stdlib_bytes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps")
    parser.add_argument("--seq", type=int, default=1024, help="characters per window (a multiple of the sp size)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4, help="attention heads (split over the sequence ranks)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--out", default="runs/train_llama_ulysses", help="where checkpoints go (logs: see the config)")
    parser.add_argument("--seed", type=int, default=1234)
    return deepspeed.add_config_arguments(parser).parse_args()


def sequence_parallel_loss(engine, windows: torch.Tensor) -> torch.Tensor:
    """This rank's slice of the windows through the model; the loss is the whole windows' mean on every rank."""
    sp, sp_rank = groups._get_sequence_parallel_world_size(), groups._get_sequence_parallel_rank()
    positions = torch.arange(windows.shape[1], device=windows.device).expand_as(windows)
    piece = dsseq.shard_batch({"input_ids": windows, "position_ids": positions, "labels": windows}, sp_rank, sp)
    logits = engine(input_ids=piece["input_ids"], position_ids=piece["position_ids"]).logits
    return dsseq.sequence_parallel_loss(logits, piece["shift_labels"], groups._get_sequence_parallel_group())


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed()  # first: under mpirun it also sets LOCAL_WORLD_SIZE from MPI's variables
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(args.seed)  # the same on every rank: the sequence ranks of a replica hold the same weights
    ds_config = json.loads(Path(args.deepspeed_config).read_text()) if args.deepspeed_config else {}
    sp, micro = ds_config.get("sequence_parallel_size", 1), ds_config.get("train_micro_batch_size_per_gpu", 1)

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    # windows of exactly --seq characters: the labels are the inputs (the loss shifts them over the whole window)
    train_data, val_data = CharWindows(text[:split], args.seq - 1), CharWindows(text[split:], args.seq - 1)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq,
                                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      attn_implementation="sdpa")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", sequence_parallel_size=sp,
                                                          micro_batch_size=micro, seq_length=args.seq,
                                                          seq_length_is_variable=False)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=train_data, mpu=mpu)
    sp_rank = groups._get_sequence_parallel_rank()
    share = args.seq // sp
    print(f"rank {rank}: sequence-parallel rank {sp_rank} of {sp}, characters {sp_rank * share}.."
          f"{(sp_rank + 1) * share - 1} of each {args.seq}-character window; {engine.dp_world_size} data-parallel "
          f"replica(s)", flush=True)

    batches = deepspeed.RepeatingLoader(loader)
    bar = ProgressBar(args.steps, enabled=rank == 0)
    first, last, window = [], [], 10
    began = time.perf_counter()
    while engine.global_steps < args.steps:
        step_loss = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            loss = sequence_parallel_loss(engine, next(batches).to(engine.device))
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / engine.gradient_accumulation_steps()
        (first if len(first) < window else last).append(step_loss)
        last[:] = last[-window:]
        bar.update(engine.global_steps, step_loss, engine.train_batch_size())
    bar.close()
    val = evaluate(engine, val_data, loss_of=sequence_parallel_loss)
    ckpt_dir = Path(args.out) / "checkpoints" / Path(args.deepspeed_config or "config").stem
    engine.save_checkpoint(ckpt_dir)
    if rank == 0:
        print(f"trained steps 0..{engine.global_steps} in {time.perf_counter() - began:.0f} s; first loss "
              f"{sum(first) / len(first):.3f} -> last loss {sum(last or first) / len(last or first):.3f} (mean of "
              f"up to {window} steps); validation loss {val:.3f}", flush=True)
        print(f"checkpoint: {ckpt_dir}", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
