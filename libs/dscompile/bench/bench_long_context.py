"""long_context_checkpointing's trade: activation memory kept for backward against step time, one process.

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dscompile/bench/bench_long_context.py [--seq 8192]

A tiny Llama (transformers, from a config: hidden 64, 2 layers, 4 query / 2 key-value heads, vocab 1024,
sdpa; the model of libs/dsseq/bench/bench_ulysses.py), fp32, one thread, forward + backward of one sequence
of --seq tokens. Modes: eager; inductor; inductor with long_context_backend (threshold --min-seq-len,
default seq // 2, so the pass is on). For the two inductor modes, the bytes of the activations backward
takes from forward (what the partitioner saved, counted on the graphs) and the median step after a
compiling one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

import dscompile


def llama(seq: int):
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                      max_position_embeddings=seq, attn_implementation="sdpa",
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).train()


def run(seq: int, backend, steps: int) -> list[float]:
    torch._dynamo.reset()
    model = llama(seq)
    step = model if backend is None else torch.compile(model, backend=backend)
    ids = torch.randint(3, 1024, (1, seq), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps + 1):  # the first compiles
        start = time.perf_counter()
        step(input_ids=ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    return times[1:]


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--min-seq-len", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    threshold = args.min_seq_len or args.seq // 2
    report = {"seq": args.seq, "min_seq_len": threshold, "load_before": load()}
    off = dscompile.long_context_backend("inductor", min_seq_len=10**9)  # the same partitioner, nothing tagged
    on = dscompile.long_context_backend("inductor", min_seq_len=threshold)
    for name, backend in (("eager", None), ("inductor", off), ("inductor+long_context", on)):
        times = run(args.seq, backend, args.steps)
        report[name] = {"step_s": statistics.median(times), "all_step_s": times}
        if backend is not None:
            report[name]["saved_MiB"] = sum(backend.partitioner.saved_bytes) / 2**20
            report[name]["recomputed_nodes"] = sum(len(p.recomputed) for p in backend.partitioner.plans)
        print(json.dumps({name: report[name]}), flush=True)
    report["saved_ratio"] = report["inductor+long_context"]["saved_MiB"] / report["inductor"]["saved_MiB"]
    report["step_ratio"] = report["inductor+long_context"]["step_s"] / report["inductor"]["step_s"]
    report["load_after"] = load()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
