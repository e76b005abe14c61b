"""AutoSP against Ulysses wrapped by hand, on the tiny Llama of bench_ulysses.py, 2 gloo ranks at sp 2.

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsseq/bench/bench_ulysses.py --modes autosp [--seq 8192]

hand:    register_with_transformers (DistributedAttention around transformers' sdpa), the batch sharded by
         dsseq.shard_batch, dsseq.sequence_parallel_loss; eager.
autosp:  dsseq.compile_autosp (the pass puts the all-to-alls into the graph) on the whole sequence from
         prepare_autosp_inputs; backend aot_eager (the same kernels as eager: what is compared is where the
         sharding lives, not inductor's fusion) and inductor.
A timed step is forward, backward and an SGD update on every rank; the first step (compilation) is not timed.
"""

from __future__ import annotations

import statistics
import time

import torch
from bench_ulysses import llama, tokens

import dscomm
import dsseq
from dscomm.testing import run_ranks


def autosp_rank(rank: int, world: int, seq: int, mode: str, steps: int) -> list[float]:
    torch.set_num_threads(1)
    model = llama(seq)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    group = torch.distributed.group.WORLD
    if mode == "hand":
        mpu = dsseq.UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, micro_batch_size=1)
    else:
        dsseq.compile_autosp(model, group, backend=mode.removeprefix("autosp-"))
    times = []
    for step in range(steps + 1):
        ids = tokens(step, seq)
        dscomm.barrier()
        start = time.perf_counter()
        if mode == "hand":
            piece = dsseq.shard_batch({"input_ids": ids, "position_ids": torch.arange(seq)[None], "labels": ids},
                                      mpu.get_sequence_parallel_rank(), world)
            logits = model(input_ids=piece["input_ids"], position_ids=piece["position_ids"]).logits
            loss = dsseq.sequence_parallel_loss(logits, piece["shift_labels"], mpu.sequence)
        else:
            ids, labels, positions, _ = dsseq.prepare_autosp_inputs(ids, ids.clone())
            loss = model(input_ids=ids, labels=labels, position_ids=positions).loss
        loss.backward()
        for param in model.parameters():  # the sequence ranks' average, as ZeRO's sequence x data group
            dscomm.all_reduce(param.grad, group=group)
        optimizer.step()
        optimizer.zero_grad()
        dscomm.barrier()
        if step:
            times.append(time.perf_counter() - start)
    return times


def bench_autosp(seq: int, steps: int, repeats: int) -> dict:
    times: dict[str, list[float]] = {"hand": [], "autosp-aot_eager": [], "autosp-inductor": []}
    for _ in range(repeats):
        for mode in times:  # alternated, so all see the same load on average
            times[mode] += max(run_ranks(autosp_rank, 2, seq, mode, steps, timeout=3600), key=sum)
    median = {mode: statistics.median(values) for mode, values in times.items()}
    return {"seq": seq, "step_s": median, "tokens_per_s": {m: seq / t for m, t in median.items()},
            "autosp_over_hand": {m: median[m] / median["hand"] for m in median if m != "hand"}, "all_step_s": times}
