"""DeepSpeed's gating results for small seeded cases, as JSON (tests/deepspeed_gating_cases.json).

Run with DeepSpeed installed (never a dependency of dsmoe), e.g. in a throwaway venv:
    DS_ACCELERATOR=cpu /tmp/dsvenv/bin/python bench/deepspeed_gating_cases.py tests/deepspeed_gating_cases.json
tests/test_gating_deepspeed.py checks dsmoe's gates against the file, drawing their random numbers
from a generator seeded as DeepSpeed's default one was.
"""
import json
import sys
from pathlib import Path

import torch
from deepspeed.moe.sharded_moe import top1gating, top2gating, topkgating

CASES = [("top1", {"use_rts": True}), ("top1", {"noisy_gate_policy": "RSample"}), ("top1", {"drop_tokens": False}),
         ("top2", {}), ("top2", {"drop_tokens": False, "top2_2nd_expert_sampling": False}), ("topk", {"k": 3})]


def main(target: str) -> None:
    out = []
    for seed in range(3):
        for name, kwargs in CASES:
            logits = torch.randn(10 + seed, 4, generator=torch.Generator().manual_seed(seed)) * 2
            factor = [0.6, 1.0, 1.3][seed]
            kw = dict(kwargs)
            torch.manual_seed(100 + seed)  # DeepSpeed draws from the default generator
            if name == "top1":
                result = top1gating(logits.clone(), factor, 0, **kw)
            elif name == "top2":
                result = top2gating(logits.clone(), factor, 0, **kw)
            else:
                result = topkgating(logits.clone(), kw["k"], factor, 0, **{k: v for k, v in kw.items() if k != "k"})
            l_aux, combine, _dispatch, counts = result
            routes = [[*map(int, i), float(combine[tuple(i)])] for i in combine.nonzero()]
            out.append({"gate": name, "kwargs": kw, "rng_seed": 100 + seed, "capacity_factor": factor,
                        "logits": logits.tolist(), "l_aux": float(l_aux), "exp_counts": counts.tolist(),
                        "capacity": combine.shape[2], "routes": routes})
    source = "deepspeed 0.19.8 deepspeed.moe.sharded_moe, min_capacity 0, torch.manual_seed(rng_seed) before each call"
    Path(target).write_text(json.dumps({"source": source, "cases": out}))
    print(f"{len(out)} cases written to {target}")


if __name__ == "__main__":
    main(sys.argv[1])
