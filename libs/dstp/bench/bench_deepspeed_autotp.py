"""DeepSpeed 0.19.8's AutoTP on the same model and steps as bench_tp.py, for the side-by-side figure.

Runs in a throwaway venv with deepspeed (never a dstrain dependency):

    python3 -m venv /tmp/dsvenv && /tmp/dsvenv/bin/pip install -c constraints.txt deepspeed==0.19.8 transformers
    DS_ACCELERATOR=cpu flock /tmp/dstrain-bench.lock /tmp/dsvenv/bin/python libs/dstp/bench/bench_deepspeed_autotp.py

Prints one JSON line per mode (tp2, tp2_overlap: DeepSpeed's tp_overlap_comm) like bench_tp.py.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from bench_tp import VOCAB, llama


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, world: int, port: int, mode: str, steps: int, warmup: int, batch: int, seq: int,
              out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": mode == "tp2_overlap"}}
    model = llama()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))
    times = []
    for step in range(warmup + steps):
        torch.distributed.barrier()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    with open(f"{out}.{rank}", "w") as handle:
        json.dump({"mode": f"deepspeed_{mode}", "step_s": statistics.median(times),
                   "samples_per_s": batch / statistics.median(times)}, handle)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--modes", default="tp2,tp2_overlap")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        out = os.path.join(tempfile.mkdtemp(), "result")
        mp.start_processes(rank_main, args=(2, _free_port(), mode, args.steps, args.warmup, args.batch, args.seq,
                                            out), nprocs=2, start_method="spawn")
        results = []
        for rank in range(2):
            with open(f"{out}.{rank}") as handle:
                results.append(json.load(handle))
        print(json.dumps(max(results, key=lambda r: r["step_s"])), flush=True)


if __name__ == "__main__":
    main()
