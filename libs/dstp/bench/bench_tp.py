"""Step time of a Llama-shaped model on 2 gloo ranks: TP 2 against DP 2, and the exposed tensor-parallel
communication (time blocked in its collectives per step) with and without tp_overlap_comm.

    flock /tmp/dstrain-bench.lock python libs/dstp/bench/bench_tp.py [--steps 4] [--modes dp2,tp2,tp2_overlap]

Each rank uses one compute thread (2 ranks on the 2 cores here). The model is built from a config
(4 layers, hidden 1024, 16 heads over 8 key/value heads), float32, AdamW through dstrain.initialize
at ZeRO stage 0. Prints one JSON line per mode and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 1024, 4, 16, 8, 2816, 2048


def llama(seed: int = 0):
    import transformers

    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


def run_mode(rank: int, world: int, mode: str, steps: int, warmup: int, batch: int, seq: int) -> dict:
    import dstp
    import dstrain

    torch.set_num_threads(1)
    tp = 1 if mode == "dp2" else 2
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 0},
              "tensor_parallel": {"autotp_size": tp, "tp_overlap_comm": mode == "tp2_overlap"}}
    engine, *_ = dstrain.initialize(model=llama(), config=config)
    state = dstp.state_of(engine.module)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(rank if tp == 1 else 0))
    times, exposed = [], []
    for step in range(warmup + steps):
        if state is not None:
            state.clock.reset()
        torch.distributed.barrier()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
            exposed.append(state.clock.blocked_s if state is not None else 0.0)
    samples = batch * (world // tp)
    return {"mode": mode, "step_s": statistics.median(times), "samples_per_s": samples / statistics.median(times),
            "exposed_tp_comm_s": statistics.median(exposed), "tp_collectives": state.clock.collectives if state else 0}


def run_ab(rank: int, world: int, steps: int, warmup: int, batch: int, seq: int) -> dict:
    """TP 2 without and with tp_overlap_comm in one process group, steps alternating, so the load of a
    shared machine falls on both alike: medians of step time and exposed communication."""
    import dstp
    import dstrain

    torch.set_num_threads(1)
    engines = {}
    for overlap in (False, True):
        config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 0},
                  "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": overlap}}
        engines[overlap], *_ = dstrain.initialize(model=llama(), config=config)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))
    measured = {False: ([], []), True: ([], [])}
    for step in range(warmup + steps):
        for overlap, engine in engines.items():
            clock = dstp.state_of(engine.module).clock
            clock.reset()
            torch.distributed.barrier()
            start = time.perf_counter()
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            if step >= warmup:
                measured[overlap][0].append(time.perf_counter() - start)
                measured[overlap][1].append(clock.blocked_s)
    return {("tp2_overlap" if overlap else "tp2"): {"step_s": statistics.median(times),
                                                     "exposed_tp_comm_s": statistics.median(blocked)}
            for overlap, (times, blocked) in measured.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--modes", default="dp2,tp2,tp2_overlap")
    parser.add_argument("--ab", action="store_true", help="TP 2 without and with overlap, steps alternating")
    args = parser.parse_args()
    from dscomm.testing import run_ranks

    if args.ab:
        for rank_result in run_ranks(run_ab, 2, args.steps, args.warmup, args.batch, args.seq, timeout=3600):
            off, on = rank_result["tp2"], rank_result["tp2_overlap"]
            print(json.dumps(rank_result))
            print(f"overlap hides {100 * (1 - on['exposed_tp_comm_s'] / off['exposed_tp_comm_s']):.0f}% of the "
                  f"exposed TP communication; step {off['step_s']:.3f} s -> {on['step_s']:.3f} s")
        return

    results = {}
    for mode in args.modes.split(","):
        per_rank = run_ranks(run_mode, 2, mode, args.steps, args.warmup, args.batch, args.seq, timeout=3600)
        worst = max(per_rank, key=lambda r: r["step_s"])
        results[mode] = worst
        print(json.dumps(worst), flush=True)
    if "tp2" in results and "tp2_overlap" in results:
        off, on = results["tp2"], results["tp2_overlap"]
        hidden = 1 - on["exposed_tp_comm_s"] / off["exposed_tp_comm_s"] if off["exposed_tp_comm_s"] else 0.0
        print(f"overlap hides {100 * hidden:.0f}% of the exposed TP communication "
              f"({off['exposed_tp_comm_s'] * 1e3:.1f} ms -> {on['exposed_tp_comm_s'] * 1e3:.1f} ms per step); "
              f"step {off['step_s']:.3f} s -> {on['step_s']:.3f} s")
    if "tp2" in results and "dp2" in results:
        print(f"TP 2 step / DP 2 step: {results['tp2']['step_s'] / results['dp2']['step_s']:.2f} "
              f"(samples/s TP 2 {results['tp2']['samples_per_s']:.2f}, DP 2 {results['dp2']['samples_per_s']:.2f})")


if __name__ == "__main__":
    main()
