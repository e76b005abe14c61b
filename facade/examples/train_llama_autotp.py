"""Train a small Hugging Face Llama with AutoTP tensor parallelism (DeepSpeed's AutoTP training tutorial), with dstrain.

    dstrain --num_procs 2 facade/examples/train_llama_autotp.py --deepspeed_config facade/examples/configs/autotp2.json

The model is transformers' LlamaForCausalLM built from a config (nothing is downloaded), reading the Python
standard library's source as characters (a vocabulary of 256 bytes). The config's
`"tensor_parallel": {"autotp_size": 2}` is the only parallelism line: `deepspeed.initialize()` cuts every
attention and MLP projection over the 2 tensor ranks by the Llama rules (whole heads per rank, key/value
heads by their own count) before the optimizer is built, and ZeRO runs over the data-parallel ranks
(2 processes: 1 replica; 4 processes: 2). Both tensor ranks read the same batches. Checkpoints keep one
folder per tensor rank and load at another degree. Written as a DeepSpeed script would be
(`import dstrain as deepspeed` is the only change).
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import transformers

import dstrain as deepspeed

sys.path.insert(0, str(Path(__file__).parent))
from evaluation import evaluate
from progress import ProgressBar
from text_corpus import CharWindows, stdlib_bytes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps")
    parser.add_argument("--seq", type=int, default=128, help="characters of context")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4, help="attention heads (a multiple of autotp_size)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (a multiple of autotp_size)")
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--out", default="runs/train_llama_autotp", help="where checkpoints go (logs: see the config)")
    parser.add_argument("--seed", type=int, default=1234)
    return deepspeed.add_config_arguments(parser).parse_args()


def causal_lm_loss(engine, tokens: torch.Tensor) -> torch.Tensor:
    return engine(input_ids=tokens, labels=tokens).loss  # transformers shifts the labels itself


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed()  # first: under mpirun it also sets LOCAL_WORLD_SIZE from MPI's variables
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(args.seed)  # the same on every rank: each tensor rank cuts the same whole weights

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    train_data, val_data = CharWindows(text[:split], args.seq), CharWindows(text[split:], args.seq)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq + 1,
                                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    whole = sum(p.numel() for p in model.parameters())
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=train_data)
    held = sum(p.numel() for p in model.parameters())  # after the cut: this rank's shards and the replicated rest
    print(f"rank {rank}: tensor-parallel rank {deepspeed.utils.groups.get_model_parallel_rank()} of "
          f"{deepspeed.utils.groups.get_model_parallel_world_size()}, holds {held:,} of the "
          f"model's {whole:,} parameters; {engine.dp_world_size} data-parallel replica(s)", flush=True)

    batches = deepspeed.RepeatingLoader(loader)
    bar = ProgressBar(args.steps, enabled=rank == 0)
    first, last, window = [], [], 10
    began = time.perf_counter()
    while engine.global_steps < args.steps:
        step_loss = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            loss = causal_lm_loss(engine, next(batches).to(engine.device))  # the loader yields CPU tensors
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / engine.gradient_accumulation_steps()
        (first if len(first) < window else last).append(step_loss)
        last[:] = last[-window:]
        bar.update(engine.global_steps, step_loss, engine.train_batch_size())
    bar.close()
    val = evaluate(engine, val_data, loss_of=causal_lm_loss)
    ckpt_dir = Path(args.out) / "checkpoints" / Path(args.deepspeed_config or "config").stem
    engine.save_checkpoint(ckpt_dir)  # tp_00_of_02/, tp_01_of_02/: each tensor rank's shards
    if rank == 0:
        print(f"trained steps 0..{engine.global_steps} in {time.perf_counter() - began:.0f} s; first loss "
              f"{sum(first) / len(first):.3f} -> last loss {sum(last or first) / len(last or first):.3f} (mean of "
              f"up to {window} steps); validation loss {val:.3f}", flush=True)
        print(f"checkpoint: {ckpt_dir}", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
