"""AutoEP on a Mixtral-shaped MoE layer: forward + backward, float32, on the CPU.

Default shape: 8 experts, hidden 1024, ffn 3584 (SwiGLU, fused gate+up), top-2, 4096 tokens: the
Hugging Face MixtralSparseMoeBlock swapped by dsmoe.autoep.apply.

1. one process: the experts by torch._grouped_mm against the per-expert loop (and the unswapped HF
   block, whose experts loop over the experts hit);
2. two gloo ranks, the same 4096 tokens split between them: autoep_size 1 (every rank holds all
   experts) against autoep_size 2 (each holds 4, tokens exchanged by all-to-all-v); one torch
   thread per rank.

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsmoe/bench/bench_autoep.py
    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsmoe/bench/bench_autoep.py --tokens 1024 --ffn 1792
    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsmoe/bench/bench_autoep.py \
        --deepspeed-python /tmp/dsvenv/bin/python \
        --deepspeed-pythonpath /tmp/dsvenv/lib/python3.11/site-packages:.venv/lib/python3.11/site-packages

3. with --deepspeed-python: a DeepSeek-V3 model with the same expert shapes (one group, one shared
   expert), its MoE layer converted by dsmoe's AutoEP and by DeepSpeed 0.19.8's (never a dependency;
   run in DeepSpeed's interpreter), autoep_size 1, one process.

Each timing is the median of --repeats forward+backward passes after one warm-up pass; the one-process
comparison alternates the implementations over --rounds and reports medians.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch
from torch import nn


def build(args: argparse.Namespace) -> tuple[nn.Module, object]:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=args.hidden, intermediate_size=args.ffn, num_local_experts=args.experts,
                           num_experts_per_tok=args.top_k)
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, 0.02)
    return nn.ModuleDict({"mlp": block}), config


def swapped(model: nn.Module, config: object, ep_size: int = 1, group: object = None,
            backend: str | None = None) -> nn.Module:
    from dsconfig import ExpertParallelConfig
    from dsmoe import autoep

    model = copy.deepcopy(model)
    autoep.apply(model, ExpertParallelConfig(enabled=True, autoep_size=ep_size, preset_model="mixtral",
                                             moe_layer_pattern="mlp"), group, model_config=config, backend=backend)
    return model


def time_passes(layer: nn.Module, x: torch.Tensor, repeats: int, barrier=None) -> float:
    def one() -> float:
        if barrier is not None:
            barrier()
        start = time.perf_counter()
        inp = x.detach().requires_grad_(True)
        layer(inp.unsqueeze(0)).sum().backward()
        if barrier is not None:
            barrier()
        return time.perf_counter() - start

    one()
    return statistics.median(one() for _ in range(repeats))


def single_process(args: argparse.Namespace) -> dict[str, float]:
    """Rounds alternate the implementations (the machine's load drifts); each figure is the median over
    rounds, and "loop / grouped_mm" the median of the per-round ratios."""
    model, config = build(args)
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    layers = {"autoep grouped_mm": swapped(model, config, backend="grouped_mm")["mlp"],
              "autoep loop": swapped(model, config, backend="loop")["mlp"],
              "HF MixtralSparseMoeBlock": model["mlp"]}
    rounds: dict[str, list[float]] = {label: [] for label in layers}
    for _ in range(args.rounds):
        for label, layer in layers.items():
            rounds[label].append(time_passes(layer, x, args.repeats))
    results: dict[str, float] = {label: statistics.median(times) for label, times in rounds.items()}
    results["loop / grouped_mm"] = statistics.median(
        loop / grouped for loop, grouped in zip(rounds["autoep loop"], rounds["autoep grouped_mm"]))
    return results


def _rank(rank: int, world: int, args: argparse.Namespace) -> dict[str, float]:
    import dscomm

    torch.set_num_threads(1)
    model, config = build(args)
    tokens = args.tokens // world
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))[rank * tokens:(rank + 1) * tokens]
    groups = dscomm.ParallelDims(world, expert=world).build()
    barrier = torch.distributed.barrier
    results = {}
    for ep in (1, world):
        layer = swapped(model, config, ep, groups.expert if ep > 1 else None, backend="grouped_mm")["mlp"]
        results[f"autoep_size {ep}"] = time_passes(layer, x, args.repeats, barrier)
    return results


def deepseek_shaped(args: argparse.Namespace) -> nn.Module:
    """A DeepSeek-V3 model whose one MoE layer has the bench's expert shapes (8 experts, top-2, one
    group, one shared expert): the family DeepSpeed 0.19.8's AutoEP converts under transformers 5.24
    (its Mixtral conversion fails there, in transformers' output-recorder registry)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(vocab_size=64, hidden_size=args.hidden, intermediate_size=args.ffn,
                              moe_intermediate_size=args.ffn, n_routed_experts=args.experts,
                              num_experts_per_tok=args.top_k, n_group=1, topk_group=1, n_shared_experts=1,
                              first_k_dense_replace=1, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                              qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=32)
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    return model


def deepspeed_side(args: argparse.Namespace) -> dict[str, float]:
    """Run by DeepSpeed's interpreter: its AutoEP layer at autoep_size 1, forward + backward."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29631"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    model = deepseek_shaped(args)
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
           "expert_parallel": {"enabled": True, "autoep_size": 1}}
    engine, *_ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    layer = engine.module.model.layers[1].mlp
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    return {"DeepSpeed 0.19.8 AutoEP": time_passes(layer, x, args.repeats),
            "DeepSpeed layer": type(layer).__name__}


def compare_deepspeed(args: argparse.Namespace) -> dict[str, object]:
    import subprocess

    from dsconfig import ExpertParallelConfig
    from dsmoe import autoep

    model = deepseek_shaped(args)
    autoep.apply(model, ExpertParallelConfig(enabled=True))
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    argv = [args.deepspeed_python, __file__, "--deepspeed-side", "--tokens", str(args.tokens), "--hidden",
            str(args.hidden), "--ffn", str(args.ffn), "--experts", str(args.experts), "--top-k", str(args.top_k),
            "--repeats", str(args.repeats)]
    env = dict(os.environ)
    if args.deepspeed_pythonpath:
        env["PYTHONPATH"] = args.deepspeed_pythonpath
    mine, theirs, layer = [], [], None
    for _ in range(args.rounds):  # alternating, as the load drifts
        mine.append(time_passes(model.model.layers[1].mlp, x, args.repeats))
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode:
            return {"dsmoe AutoEP (grouped_mm)": statistics.median(mine), "DeepSpeed": f"failed: {done.stderr[-600:]}"}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        theirs.append(result["DeepSpeed 0.19.8 AutoEP"])
        layer = result["DeepSpeed layer"]
    return {"rounds": {"dsmoe": mine, "DeepSpeed": theirs},
            "dsmoe AutoEP (grouped_mm)": statistics.median(mine), "DeepSpeed 0.19.8 AutoEP": statistics.median(theirs),
            "dsmoe / DeepSpeed (median of per-round ratios)": statistics.median(a / b for a, b in zip(mine, theirs)),
            "DeepSpeed layer": layer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=3584)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-ranks", action="store_true", help="only the one-process comparison")
    parser.add_argument("--deepspeed-python", help="an interpreter with deepspeed: DeepSeek-V3-shaped layer, "
                                                   "dsmoe's AutoEP against DeepSpeed's (only this comparison)")
    parser.add_argument("--deepspeed-pythonpath", help="PYTHONPATH for it (e.g. its site-packages, then one with "
                                                       "transformers)")
    parser.add_argument("--deepspeed-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.deepspeed_side:
        print(json.dumps(deepspeed_side(args)))
        return
    if args.deepspeed_python:
        print(json.dumps({"shape": vars(args), "DeepSeek-V3-shaped MoE layer, autoep_size 1 (s per fwd+bwd)":
                          compare_deepspeed(args)}, indent=2))
        return
    report: dict[str, object] = {"shape": vars(args), "threads": torch.get_num_threads()}
    report["one process (s per fwd+bwd)"] = single_process(args)
    if not args.skip_ranks:
        from dscomm.testing import run_ranks

        per_rank = run_ranks(_rank, 2, args, timeout=3600)
        report["2 gloo ranks, 1 thread each (s per fwd+bwd, slower rank)"] = {
            key: max(r[key] for r in per_rank) for key in per_rank[0]}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
