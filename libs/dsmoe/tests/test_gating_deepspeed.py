"""dsmoe's gates against DeepSpeed 0.19.8's for the same logits and the same random draws.

tests/deepspeed_gating_cases.json holds DeepSpeed's results (bench/deepspeed_gating_cases.py wrote
them with DeepSpeed installed; it is never a dependency). DeepSpeed draws from torch's default
generator after torch.manual_seed(rng_seed); dsmoe takes a generator seeded the same way, so even
the cases that drop tokens (random token selection, Gumbel sampling) must agree route for route.
"""

import json
from pathlib import Path

import pytest
import torch

import dsmoe

CASES = json.loads((Path(__file__).parent / "deepspeed_gating_cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['gate']}-{i}" for i, c in enumerate(CASES)])
def test_the_same_routes_weights_counts_and_loss_as_deepspeed(case):
    logits = torch.tensor(case["logits"], dtype=torch.float32)
    gen = torch.Generator().manual_seed(case["rng_seed"])
    kw, cf = dict(case["kwargs"]), case["capacity_factor"]
    if case["gate"] == "top1":
        l_aux, combine, dispatch, counts = dsmoe.top1gating(logits, cf, 0, generator=gen, **kw)
    elif case["gate"] == "top2":
        l_aux, combine, dispatch, counts = dsmoe.top2gating(logits, cf, 0, generator=gen, **kw)
    else:
        k = kw.pop("k")
        l_aux, combine, dispatch, counts = dsmoe.topkgating(logits, k, cf, 0, **kw)
    assert combine.shape[2] == case["capacity"]
    assert counts.tolist() == case["exp_counts"]
    got = {tuple(int(i) for i in index): float(combine[tuple(index)]) for index in combine.nonzero()}
    want = {tuple(route[:3]): route[3] for route in case["routes"]}
    assert got.keys() == want.keys()
    for key, weight in want.items():
        assert got[key] == pytest.approx(weight, rel=1e-6, abs=1e-7)
    assert torch.equal(dispatch, combine != 0)
    assert l_aux.item() == pytest.approx(case["l_aux"], rel=1e-6)
