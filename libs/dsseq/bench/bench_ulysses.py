"""Ulysses on a tiny Llama at a long sequence, gloo ranks on the CPU, anchors in the same run.

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsseq/bench/bench_ulysses.py [--seq 8192] [--modes ...]

memory:      peak tensor memory of one training forward + backward (dsseq.TensorMemory: activations, their
             gradients, temporaries) per rank at sp 2 on 2 ranks, against one rank on the whole sequence.
throughput:  tokens per second of whole optimizer steps through dstrain.initialize, sp 2 against dp 2 on the
             same global batch (2 sequences per step): dp 2 gives each rank a sequence; sp 2 runs both
             sequences one after the other, each cut over the 2 ranks (gradient accumulation 2).
autosp:      AutoSP (compile.passes ["autosp"]) against the same model with DistributedAttention wrapped by hand
             (needs dscompile).
Each rank computes on one thread (2 ranks on 2 cores). Medians over the timed steps of every repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import dscomm
import dsseq
from dscomm.testing import run_ranks

VOCAB = 1024


def llama(seq: int):
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=seq, attn_implementation="sdpa",
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).train()


def tokens(index: int, seq: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, seq), generator=torch.Generator().manual_seed(index))


# ------------------------------------------------------------------------------------------- memory
def memory_rank(rank: int, world: int, seq: int) -> int:
    model = llama(seq)
    ids = tokens(0, seq)
    if world == 1:
        with dsseq.TensorMemory() as memory:
            model(input_ids=ids, labels=ids).loss.backward()
        return memory.peak_bytes
    mpu = dsseq.UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, micro_batch_size=1)
    piece = dsseq.shard_batch({"input_ids": ids, "position_ids": torch.arange(seq)[None], "labels": ids},
                              mpu.get_sequence_parallel_rank(), world)
    with dsseq.TensorMemory() as memory:
        logits = model(input_ids=piece["input_ids"], position_ids=piece["position_ids"]).logits
        dsseq.sequence_parallel_loss(logits, piece["shift_labels"], mpu.sequence).backward()
    return memory.peak_bytes


def bench_memory(seq: int) -> dict:
    whole = run_ranks(memory_rank, 1, seq, timeout=1800)[0]
    sliced = max(run_ranks(memory_rank, 2, seq, timeout=1800))
    return {"seq": seq, "one_rank_whole_sequence_MiB": whole / 2**20, "sp2_per_rank_MiB": sliced / 2**20,
            "ratio": sliced / whole}


# --------------------------------------------------------------------------------------- throughput
def throughput_rank(rank: int, world: int, seq: int, mode: str, steps: int) -> list[float]:
    import dstrain

    model = llama(seq)
    config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0,
              "steps_per_print": 10**6, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    mpu = None
    if mode == "sp2":
        mpu = dsseq.UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", 2, micro_batch_size=1)
        config["sequence_parallel_size"] = 2
    engine, *_ = dstrain.initialize(model=model, config=config, mpu=mpu)
    times = []
    for step in range(steps + 1):  # the first is a warm-up
        dscomm.barrier()
        start = time.perf_counter()
        if mode == "dp2":
            ids = tokens(2 * step + rank, seq)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        else:
            for micro in range(2):
                ids = tokens(2 * step + micro, seq)
                piece = dsseq.shard_batch({"input_ids": ids, "position_ids": torch.arange(seq)[None], "labels": ids},
                                          mpu.get_sequence_parallel_rank(), 2)
                logits = engine(input_ids=piece["input_ids"], position_ids=piece["position_ids"]).logits
                engine.backward(dsseq.sequence_parallel_loss(logits, piece["shift_labels"], mpu.sequence))
                engine.step()
        dscomm.barrier()
        if step:
            times.append(time.perf_counter() - start)
    return times


def bench_throughput(seq: int, steps: int, repeats: int) -> dict:
    times: dict[str, list[float]] = {"dp2": [], "sp2": []}
    for _ in range(repeats):
        for mode in times:  # alternated, so both see the same load on average
            times[mode] += max(run_ranks(throughput_rank, 2, seq, mode, steps, timeout=3600), key=sum)
    median = {mode: statistics.median(values) for mode, values in times.items()}
    tokens_per_step = 2 * seq
    return {"seq": seq, "step_s": median, "tokens_per_s": {m: tokens_per_step / t for m, t in median.items()},
            "dp2_over_sp2": median["sp2"] / median["dp2"], "all_step_s": times}


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="memory,throughput")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    llama(64)  # the modeling code is imported once, before the ranks fork
    report = {"load_before": load()}
    for mode in args.modes.split(","):
        if mode == "memory":
            report["memory"] = bench_memory(args.seq)
        elif mode == "throughput":
            report["throughput"] = bench_throughput(args.seq, args.steps, args.repeats)
        elif mode == "autosp":
            from bench_autosp import bench_autosp  # needs dscompile

            report["autosp"] = bench_autosp(args.seq, args.steps, args.repeats)
        else:
            sys.exit(f"unknown mode {mode!r}; valid: memory, throughput, autosp")
        print(json.dumps({mode: report[mode]}, indent=1), flush=True)
    report["load_after"] = load()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
