"""Generation speed of the Hybrid Engine at ZeRO-3 on 2 gloo ranks, beside its anchors in the same ranks.

Each rank generates `--new` tokens (greedy, length pinned) for `--batch` prompts per call with:
- `hybrid`: an engine with hybrid_engine.enabled (weights gathered once per call, then held);
- `plain`: an engine without it (ZeRO-3 gathers every layer at every token's forward; synced_gpus);
- `whole`: an unpartitioned copy of the model in the same process, no engine (the anchor).
Calls alternate in rounds after one warm-up call each; printed: median seconds per call, tokens/s per rank,
and the ratios hybrid / whole and plain / hybrid.

    flock /tmp/dstrain-bench.lock python facade/bench/bench_hybrid_engine.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dstrain
from dscomm.testing import run_ranks


def llama(hidden: int, layers: int, vocab: int):
    import transformers

    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                                      vocab_size=vocab, max_position_embeddings=512, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def config(hybrid: bool) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "hybrid_engine": {"enabled": hybrid, "max_out_tokens": 512}, "steps_per_print": 10**9}


def measure(rank, world, args):
    torch.set_num_threads(1)  # two ranks share the two cores
    whole = llama(args.hidden, args.layers, args.vocab)
    hybrid, *_ = dstrain.initialize(model=llama(args.hidden, args.layers, args.vocab), config=config(True))
    plain, *_ = dstrain.initialize(model=llama(args.hidden, args.layers, args.vocab), config=config(False))
    gen = torch.Generator().manual_seed(rank)
    prompts = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=gen)
    kwargs = dict(attention_mask=torch.ones_like(prompts), max_new_tokens=args.new, min_new_tokens=args.new,
                  do_sample=False, pad_token_id=0)
    calls = {"hybrid": lambda: hybrid.module.generate(prompts, **kwargs),
             "plain": lambda: plain.module.generate(prompts, synced_gpus=True, **kwargs),
             "whole": lambda: whole.generate(prompts, **kwargs)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    outputs = {name: call() for name, call in calls.items()}  # warm-up; the tokens must agree
    for _ in range(args.rounds):
        for name, call in calls.items():
            torch.distributed.barrier()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    agree = torch.equal(outputs["hybrid"], outputs["whole"]) and torch.equal(outputs["plain"], outputs["whole"])
    params = sum(p.numel() for p in whole.parameters())
    return times, agree, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    results = run_ranks(measure, 2, args, timeout=3600)
    times = {name: [t for r in results for t in r[0][name]] for name in results[0][0]}
    medians = {name: statistics.median(values) for name, values in times.items()}
    tokens = args.batch * args.new
    print(f"model: {results[0][2] / 1e6:.1f}M parameters, ZeRO-3 on 2 gloo ranks, {args.batch} prompts x {args.new} "
          f"new tokens per rank per call, {args.rounds} rounds; tokens agree: {all(r[1] for r in results)}")
    for name, median in medians.items():
        print(f"  {name:7s} {median:8.3f} s/call  {tokens / median:8.1f} tokens/s per rank")
    print(f"hybrid / whole: {medians['hybrid'] / medians['whole']:.2f}x the time   "
          f"plain / hybrid: {medians['plain'] / medians['hybrid']:.2f}x")


if __name__ == "__main__":
    main()
