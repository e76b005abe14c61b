"""Train a small GPT on the Python standard library's source, as characters, with dstrain.

    dstrain --num_procs 2 facade/examples/train_gpt.py --deepspeed_config facade/examples/configs/zero2.json

Written as a DeepSpeed script would be (`import dstrain as deepspeed` is the only change). Logs go
to TensorBoard and CSV under runs/train_gpt/logs, checkpoints to runs/train_gpt/checkpoints/<config>;
`--resume` continues from the latest one.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

import dstrain as deepspeed

sys.path.insert(0, str(Path(__file__).parent))
from evaluation import evaluate
from gpt_model import GPT
from progress import ProgressBar
from text_corpus import CharWindows, stdlib_bytes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps to train in all (resumed included)")
    parser.add_argument("--seq", type=int, default=128, help="characters of context")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--out", default="runs/train_gpt", help="where checkpoints go (logs: see the config)")
    parser.add_argument("--save-every", type=int, default=100, help="save a checkpoint every N steps (and at the end)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    parser.add_argument("--seed", type=int, default=1234)
    return deepspeed.add_config_arguments(parser).parse_args()


def main() -> None:
    args = parse_args()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    deepspeed.init_distributed()
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(args.seed)

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    train_data, val_data = CharWindows(text[:split], args.seq), CharWindows(text[split:], args.seq)
    model = GPT(seq=args.seq, d_model=args.d_model, layers=args.layers, heads=args.heads,
                checkpoint_fn=deepspeed.checkpointing.checkpoint if args.activation_checkpointing else None)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=train_data)
    config_name = Path(args.deepspeed_config).stem if args.deepspeed_config else "config"
    ckpt_dir = Path(args.out) / "checkpoints" / config_name
    if args.resume:
        path, _client = engine.load_checkpoint(ckpt_dir)
        if path is None and rank == 0:
            print(f"--resume: no checkpoint in {ckpt_dir} yet; starting from step 0", flush=True)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"model: {params / 1e6:.2f}M parameters; corpus: {len(text) / 1e6:.1f} MB of Python source, "
              f"{len(train_data)} training windows of {args.seq} characters", flush=True)

    batches = deepspeed.RepeatingLoader(loader)
    start = engine.global_steps
    bar = ProgressBar(args.steps, start=start, enabled=rank == 0)
    first, last, window = [], [], 10
    began = time.perf_counter()
    while engine.global_steps < args.steps:
        step_loss = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(next(batches).to(engine.device))  # the loader yields CPU tensors
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / engine.gradient_accumulation_steps()
        (first if len(first) < window else last).append(step_loss)
        last[:] = last[-window:]
        bar.update(engine.global_steps, step_loss, engine.train_batch_size())
        if engine.global_steps % args.save_every == 0 or engine.global_steps == args.steps:
            bar.close() if engine.global_steps == args.steps else None
            engine.save_checkpoint(ckpt_dir)
    bar.close()
    val = evaluate(engine, val_data)
    if rank == 0:
        elapsed = time.perf_counter() - began
        trained = engine.global_steps - start
        if trained:
            print(f"trained steps {start}..{engine.global_steps} in {elapsed:.0f} s; "
                  f"first loss {sum(first) / len(first):.3f} -> last loss "
                  f"{sum(last or first) / len(last or first):.3f} (mean of up to {window} steps); "
                  f"validation loss {val:.3f}", flush=True)
        print(f"checkpoint: {ckpt_dir} (resume with --resume)", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
