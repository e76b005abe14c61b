"""DeepSpeed 0.19.8's PipelineEngine (1F1B, its only training schedule) on bench_train_batch.py's model and
batch, for the side-by-side figure. Runs in a throwaway venv with deepspeed (never a dstrain dependency):

    python3 -m venv /tmp/dsvenv && /tmp/dsvenv/bin/pip install -c constraints.txt deepspeed==0.19.8
    DS_ACCELERATOR=cpu flock /tmp/dstrain-bench.lock /tmp/dsvenv/bin/python libs/dspipe/bench/bench_deepspeed_pipe.py

Prints the median train_batch time (the slower rank's) over --rounds, after --warmup batches.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp
from torch import nn

WIDTH, LAYERS, MICRO_BATCHES = 1024, 8, 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, world: int, port: int, micro: int, rounds: int, warmup: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(world), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule

    deepspeed.init_distributed(dist_backend="gloo")
    layers = []
    for _ in range(LAYERS):
        layers += [LayerSpec(nn.Linear, WIDTH, WIDTH), nn.ReLU()]
    module = PipelineModule(layers, num_stages=world, loss_fn=lambda out, y: ((out - y) ** 2).mean(),
                            partition_method="uniform")
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": MICRO_BATCHES,
              "steps_per_print": 10**9, "optimizer": {"type": "SGD", "params": {"lr": 1e-4}},
              "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(micro, WIDTH, generator=gen), torch.randn(micro, WIDTH, generator=gen))
               for _ in range(MICRO_BATCHES)]
    times = []
    for index in range(warmup + rounds):
        torch.distributed.barrier()
        start = time.perf_counter()
        engine.train_batch(iter(batches))
        seconds = torch.tensor([time.perf_counter() - start])
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
        if index >= warmup:
            times.append(seconds.item())
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(times, handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro", type=int, default=32, help="rows per micro-batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.spawn(rank_main, args=(2, _free_port(), args.micro, args.rounds, args.warmup, out), nprocs=2)
        with open(out) as handle:
            times = json.load(handle)
    print(json.dumps({"deepspeed_1f1b_s": statistics.median(times), "rounds": len(times), "micro": args.micro}))


if __name__ == "__main__":
    main()
