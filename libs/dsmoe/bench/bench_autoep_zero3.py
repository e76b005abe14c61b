"""AutoEP at ZeRO stage 3 against stage 2, and against DeepSpeed 0.19.8's AutoEP at stage 3, on 2 gloo ranks.

The model: 4 MoE layers of bench_autoep.py's layer (8 experts, hidden 1024, ffn 3584, SwiGLU with fused
gate+up, top-2), float32, AdamW, trained through `dstrain.initialize` (ZeRO's own parameter groups, the
experts over their expert-data group), `--tokens` tokens per rank per step, one torch thread per rank.

1. A Hugging Face Mixtral of those 4 layers (small attention and vocabulary), ZeRO-3 against ZeRO-2 at each
   autoep_size: the step's time (median of --steps after one warm-up step; rounds alternate the stages, and
   the figure is the median over rounds) and the peak parameter + optimizer memory of the busier rank:
   the bytes of parameters, master weights and optimizer state it holds (dszero's memory_report), plus at
   stage 3 the most parameters gathered at once during the step (sampled right after every gather of a
   module's forward and backward). Beside the wall time, each step's CPU seconds (user + system, every thread of
   the rank: what the step costs the machine), far less sensitive than wall time to other processes sharing the
   cores, where each of stage 3's many collectives also waits for the other rank to be scheduled.
2. With --deepspeed-python: the same expert shapes in a DeepSeek-V3 model (4 MoE layers, one shared expert,
   one group), the family DeepSpeed 0.19.8's AutoEP converts under transformers 5.24 (its Mixtral conversion
   fails there, in transformers' output-recorder registry), dstrain against DeepSpeed, both at ZeRO-3 with
   the same autoep_size, alternating over the rounds; DeepSpeed runs in its own interpreter, two processes.

At stage 3, --max-live-parameters / --max-reuse-distance set stage3_max_live_parameters and
stage3_max_reuse_distance (both sides); unset, the reference's defaults (1e9 elements). --prefetch-bucket-size
sets stage3_prefetch_bucket_size on both sides, by default 5e7, what DeepSpeed 0.19.8's code uses when it is
unset (its documentation, and so dsconfig, say 5e8, more than this model's 370M elements: everything would be
prefetched from the second step on, the whole model gathered at once).

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsmoe/bench/bench_autoep_zero3.py \\
        --deepspeed-python /work/tmp/dsvenv/bin/python \\
        --deepspeed-pythonpath /work/tmp/dsvenv/lib/python3.11/site-packages:.venv/lib/python3.11/site-packages
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

import torch

VOCAB = 256


def mixtral(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=args.ffn,
                           num_local_experts=args.experts, num_experts_per_tok=args.top_k,
                           num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
                           max_position_embeddings=args.tokens, tie_word_embeddings=False)
    return _initialised(MixtralForCausalLM(config))


def deepseek(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=args.ffn,
                              moe_intermediate_size=args.ffn, n_routed_experts=args.experts,
                              num_experts_per_tok=args.top_k, n_group=1, topk_group=1, n_shared_experts=1,
                              first_k_dense_replace=0, num_hidden_layers=args.layers, num_attention_heads=8,
                              num_key_value_heads=8, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=32,
                              qk_nope_head_dim=32, v_head_dim=64, max_position_embeddings=args.tokens)
    return _initialised(DeepseekV3ForCausalLM(config))


def _initialised(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    return model.train()


def ds_config(stage: int, ep: int, args: argparse.Namespace, deepspeed_side: bool = False) -> dict:
    adamw = {"lr": 1e-4, "weight_decay": 0.0, **({"torch_adam": True} if deepspeed_side else {})}
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 50_000_000}
    if stage == 3:  # both sides the same (dstrain's default is the reference's documented 5e8, its code's 5e7)
        zero["stage3_prefetch_bucket_size"] = int(args.prefetch_bucket_size)
    if stage == 3:  # unset: the reference's defaults (1e9 elements)
        zero.update({key: int(value) for key, value in (("stage3_max_live_parameters", args.max_live_parameters),
                                                        ("stage3_max_reuse_distance", args.max_reuse_distance))
                     if value is not None})
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10_000,
            "optimizer": {"type": "AdamW", "params": adamw}, "zero_optimization": zero,
            "expert_parallel": {"enabled": True, "autoep_size": ep}}


def batch(args: argparse.Namespace, rank: int, step: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (1, args.tokens), generator=torch.Generator().manual_seed(100 * step + rank))
    return {"input_ids": ids, "labels": ids}


class GatheredPeak:
    """The most stage-3 parameter bytes gathered at once (prefetched ones included), sampled in every module
    that stage 3 gathers for, right after its gather: hooks registered after stage 3's run after its own
    forward pre-hook and backward pre-hook."""

    def __init__(self, engine):
        partitioned = engine.optimizer.partitions_parameters
        self.units = getattr(engine.optimizer, "groups", []) if partitioned else []
        self.peak = 0
        for module in getattr(engine.optimizer.reducer, "hooked_modules", []) if partitioned else []:
            module.register_forward_pre_hook(lambda *_: self.sample())
            module.register_full_backward_pre_hook(lambda *_: self.sample())

    def sample(self) -> None:
        self.peak = max(self.peak, sum(unit.gathered_bytes() for unit in self.units))


def cpu_seconds() -> float:
    """This process's CPU time so far, every thread (the backend's communication threads too), user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_steps(engine, args: argparse.Namespace, rank: int, count: int) -> tuple[list[float], list[float]]:
    """Per step: wall seconds, and this rank's CPU seconds (what the step costs the machine, far less
    sensitive than the wall time to other processes sharing the cores)."""
    times, cpu = [], []
    for step in range(count):
        torch.distributed.barrier()
        start, cpu_start = time.perf_counter(), cpu_seconds()
        loss = engine(**batch(args, rank, step)).loss
        engine.backward(loss)
        engine.step()
        cpu.append(cpu_seconds() - cpu_start)  # before the barrier: not the wait for the other rank
        torch.distributed.barrier()
        times.append(time.perf_counter() - start)
    return times, cpu


def dstrain_rank(rank: int, world: int, args: argparse.Namespace, family: str, stage: int, ep: int) -> dict:
    import dstrain

    torch.set_num_threads(1)
    model = mixtral(args) if family == "mixtral" else deepseek(args)
    cfg = ds_config(stage, ep, args)
    cfg["expert_parallel"]["preset_model"] = "mixtral" if family == "mixtral" else "deepseek_v3"
    engine, *_ = dstrain.initialize(model=model, config=cfg)
    peak = GatheredPeak(engine)
    times, cpu = (measured[1:] for measured in timed_steps(engine, args, rank, 1 + args.steps))
    report = engine.optimizer.memory_report()
    held = report["parameters"] + report["master_weights"] + report["optimizer_state"]
    result = {"step_s": statistics.median(times), "cpu_s": statistics.median(cpu), "param_opt_bytes": held + peak.peak, "held_bytes": held,
              "gathered_peak_bytes": peak.peak}
    engine.destroy()
    return result


def run_dstrain(args: argparse.Namespace, family: str, stage: int, ep: int) -> dict:
    from dscomm.testing import run_ranks

    per_rank = run_ranks(dstrain_rank, 2, args, family, stage, ep, timeout=7200)
    return {"step_s": max(r["step_s"] for r in per_rank), "cpu_s": max(r["cpu_s"] for r in per_rank),
            "param_opt_bytes": max(r["param_opt_bytes"] for r in per_rank),
            "held_bytes": max(r["held_bytes"] for r in per_rank),
            "gathered_peak_bytes": max(r["gathered_peak_bytes"] for r in per_rank)}


# ---------------------------------------------------------------------------------------------- DeepSpeed
def deepspeed_rank(args: argparse.Namespace) -> None:
    """Run by DeepSpeed's interpreter as one of 2 processes (RANK etc. in the environment)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = deepseek(args)
    engine, *_ = deepspeed.initialize(model=model, config=ds_config(3, args.ep, args, deepspeed_side=True),
                                      model_parameters=model.parameters())
    rank = torch.distributed.get_rank()
    times, cpu = (measured[1:] for measured in timed_steps(engine, args, rank, 1 + args.steps))
    print(json.dumps({"rank": rank, "step_s": statistics.median(times), "cpu_s": statistics.median(cpu)}), flush=True)


def run_deepspeed(args: argparse.Namespace, ep: int) -> dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    shape = [f"--{key.replace('_', '-')}={getattr(args, key)}" for key in
             ("tokens", "layers", "hidden", "ffn", "experts", "top_k", "steps", "max_live_parameters",
              "max_reuse_distance", "prefetch_bucket_size") if getattr(args, key) is not None]
    argv = [args.deepspeed_python, __file__, "--deepspeed-side", *shape, "--ep", str(ep)]
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "DS_ACCELERATOR": "cpu"}
        if args.deepspeed_pythonpath:
            env["PYTHONPATH"] = args.deepspeed_pythonpath
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = [proc.communicate(timeout=7200) for proc in procs]
    if any(proc.returncode for proc in procs):
        return {"failed": outputs[0][1][-800:] + outputs[1][1][-800:]}
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    return {"step_s": max(r["step_s"] for r in ranks), "cpu_s": max(r["cpu_s"] for r in ranks)}


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=3584)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ep", type=int, nargs="+", default=[1, 2], help="autoep_size values")
    parser.add_argument("--prefetch-bucket-size", type=float, default=5e7,
                        help="stage3_prefetch_bucket_size, both sides (default: DeepSpeed 0.19.8's code default)")
    parser.add_argument("--max-live-parameters", type=float, help="stage3_max_live_parameters (default: unset)")
    parser.add_argument("--max-reuse-distance", type=float, help="stage3_max_reuse_distance (default: unset)")
    parser.add_argument("--deepspeed-python", help="an interpreter with deepspeed 0.19.8 (a throwaway venv)")
    parser.add_argument("--deepspeed-pythonpath", help="PYTHONPATH for it (its site-packages, then one with "
                                                       "transformers 5)")
    parser.add_argument("--deepspeed-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.deepspeed_side:
        args.ep = args.ep[-1]
        deepspeed_rank(args)
        return
    report: dict = {"shape": {k: v for k, v in vars(args).items() if not k.startswith("deepspeed")},
                    "load_average_at_start": os.getloadavg()}
    for ep in args.ep:
        rounds = {2: [], 3: []}
        for _ in range(args.rounds):
            for stage in (2, 3):
                rounds[stage].append(run_dstrain(args, "mixtral", stage, ep))
                print(f"autoep {ep} stage {stage}: {rounds[stage][-1]}", file=sys.stderr, flush=True)
        row = {f"stage {s}": {"step_s": statistics.median(r["step_s"] for r in runs),
                              "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                              "param_opt_GiB": runs[0]["param_opt_bytes"] / 2**30,
                              "held_GiB": runs[0]["held_bytes"] / 2**30,
                              "gathered_peak_GiB": runs[0]["gathered_peak_bytes"] / 2**30}
               for s, runs in rounds.items()}
        row["stage 3 / stage 2 memory"] = row["stage 3"]["param_opt_GiB"] / row["stage 2"]["param_opt_GiB"]
        row["stage 3 / stage 2 step (median of per-round ratios)"] = statistics.median(
            a["step_s"] / b["step_s"] for a, b in zip(rounds[3], rounds[2]))
        row["stage 3 / stage 2 CPU seconds per step (median of per-round ratios)"] = statistics.median(
            a["cpu_s"] / b["cpu_s"] for a, b in zip(rounds[3], rounds[2]))
        report[f"Mixtral-shaped, autoep_size {ep}"] = row
    if args.deepspeed_python:
        for ep in args.ep:
            mine, theirs = [], []
            for _ in range(args.rounds):
                mine.append(run_dstrain(args, "deepseek", 3, ep))
                theirs.append(run_deepspeed(args, ep))
                print(f"deepseek autoep {ep}: dstrain {mine[-1]}, DeepSpeed {theirs[-1]}",
                      file=sys.stderr, flush=True)
            if any("failed" in t for t in theirs):
                report[f"DeepSeek-V3-shaped, ZeRO-3, autoep_size {ep}"] = {"DeepSpeed": theirs[-1]}
                continue
            report[f"DeepSeek-V3-shaped, ZeRO-3, autoep_size {ep}"] = {
                "dstrain step_s": statistics.median(m["step_s"] for m in mine),
                "DeepSpeed step_s": statistics.median(t["step_s"] for t in theirs),
                "dstrain / DeepSpeed (median of per-round ratios)": statistics.median(
                    m["step_s"] / t["step_s"] for m, t in zip(mine, theirs)),
                "dstrain / DeepSpeed CPU seconds per step (median of per-round ratios)": statistics.median(
                    m["cpu_s"] / t["cpu_s"] for m, t in zip(mine, theirs))}
    report["load_average_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
