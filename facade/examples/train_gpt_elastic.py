"""Elastic training: a small GPT whose job may shrink or grow between restarts and keeps its global batch.

    dstrain --elastic_training --min_elastic_nodes 1 --max_elastic_nodes 2 --master_addr 127.0.0.1 \
        --master_port 29600 --num_procs 1 facade/examples/train_gpt_elastic.py \
        --deepspeed_config facade/examples/configs/elastic.json

Run the same command again (here, or on another machine with this one's address) while it trains: the first node's
torchrun restarts its ranks, both nodes rendezvous, and training resumes from the latest checkpoint at twice the
ranks. The config's `elasticity` section picks the batch for each size (32 samples a step: micro batch 16 x 2
accumulation steps on one rank, 16 x 1 on two), and each step's samples are chosen by the step number alone, so the
run follows the same losses at any size. Checkpoints go to --out every --save-every steps; a start (or restart)
always resumes from the latest one.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

import dstrain as deepspeed

sys.path.insert(0, str(Path(__file__).parent))
from gpt_model import GPT
from text_corpus import CharWindows, stdlib_bytes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps to train in all (resumed included)")
    parser.add_argument("--seq", type=int, default=64, help="characters of context")
    parser.add_argument("--out", default="runs/train_gpt_elastic", help="where checkpoints go")
    parser.add_argument("--save-every", type=int, default=5, help="save a checkpoint every N steps (and at the end)")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds to wait after each step (gives a second node time to join in a demo)")
    return deepspeed.add_config_arguments(parser).parse_args()


def step_samples(step: int, batch: int, count: int) -> torch.Tensor:
    """The global batch of step `step`: window indices fixed by the step alone, whatever the world size."""
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, count, (batch,), generator=generator)


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    torch.manual_seed(1234)
    windows = CharWindows(stdlib_bytes(512 * 1024), args.seq)
    model = GPT(seq=args.seq, d_model=64, layers=2, heads=4)
    engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    path = engine.load_checkpoint(args.out)[0] if (Path(args.out) / "latest").is_file() else None
    if rank == 0:
        print(f"world {world}: batch {engine.train_batch_size()} = micro "
              f"{engine.train_micro_batch_size_per_gpu()} x {engine.gradient_accumulation_steps()} x {world}; "
              f"{'resumed at step ' + str(engine.global_steps) if path else 'starting at step 0'}", flush=True)
    micro, share = engine.train_micro_batch_size_per_gpu(), engine.train_batch_size() // world
    while engine.global_steps < args.steps:
        step = engine.global_steps
        mine = step_samples(step, engine.train_batch_size(), len(windows))[rank * share:(rank + 1) * share]
        step_loss = torch.zeros(())
        for start in range(0, share, micro):
            batch = torch.stack([windows[int(i)] for i in mine[start:start + micro]]).to(engine.device)
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
            step_loss += loss.detach().float() / engine.gradient_accumulation_steps()
        deepspeed.comm.all_reduce(step_loss)  # the global batch's mean loss, the same at any size
        if rank == 0:
            print(f"step {engine.global_steps} world {world} loss {step_loss.item() / world:.4f}", flush=True)
        if engine.global_steps % args.save_every == 0 or engine.global_steps == args.steps:
            engine.save_checkpoint(args.out)
        time.sleep(args.pause)
    engine.destroy()


if __name__ == "__main__":
    main()
