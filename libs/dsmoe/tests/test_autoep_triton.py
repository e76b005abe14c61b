"""The Triton grouped-GEMM expert backend equals the per-expert loop, run on the CPU by Triton's
interpreter (TRITON_INTERPRET=1, set in a subprocess before triton is imported): forward and every
gradient, both weight layouts, fused and separate gate/up, an expert with no rows and one spanning
several row tiles; float32 to 1e-5 and bfloat16 against a float32 loop over the same bfloat16
values (Triton accumulates in float32); and a tiny Mixtral swapped with backend "triton" equals the
original. Skipped where triton is not installed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = r"""
import json, sys
import torch
import torch.nn.functional as F
from dsmoe.autoep import expert_mlp

def run(backend, x, w1, w2, w3, in_out, sizes):
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w1, w2) + ((w3,) if w3 is not None else ())]
    xs, a, b = leaves[:3]
    c = leaves[3] if w3 is not None else None
    y = expert_mlp(xs, sizes, a, b, c, in_out, F.silu, backend)
    (y.float() * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()  # a gradient that is not stride 0
    return [y.detach().float()] + [t.grad.float() for t in leaves]

def worst(got, want):
    return max(float((g - w).abs().max() / (w.abs().max() + 1e-6)) for g, w in zip(got, want))

results = {}
sizes = [5, 0, 40, 2]  # an empty expert; one over a 32-row tile
for dtype in ("float32", "bfloat16"):
    for in_out in (False, True):
        for fused in (True, False):
            torch.manual_seed(0)
            E, H, FF = 4, 16, 24
            def w(out, inp):
                return torch.randn((E, inp, out) if in_out else (E, out, inp)) * 0.3
            w1 = w(2 * FF if fused else FF, H)
            w3 = None if fused else w(FF, H)
            w2 = w(H, FF)
            x = torch.randn(sum(sizes), H)
            cast = [t.to(getattr(torch, dtype)) if t is not None else None for t in (x, w1, w2, w3)]
            got = run("triton", cast[0], cast[1], cast[2], cast[3], in_out, sizes)
            want = run("loop", *[t.float() if t is not None else None for t in cast], in_out, sizes)
            results[f"{dtype} in_out={in_out} fused={fused}"] = worst(got, want)

sys.path.insert(0, sys.argv[1])
import copy
import autoep_models as M
from dsconfig import ExpertParallelConfig
from dsmoe import autoep
reference = M.build("mixtral")
swapped = copy.deepcopy(reference)
autoep.apply(swapped, ExpertParallelConfig(enabled=True), backend="triton")
backends = sorted({layer.backend for _, layer in autoep.autoep_layers(swapped)})
a, b = reference(**M.batch(3)), swapped(**M.batch(3))
a.loss.backward(); b.loss.backward()
grads = dict(reference.named_parameters())
results["mixtral loss"] = float((a.loss - b.loss).abs() / a.loss.abs())
results["mixtral grads"] = max(float((p.grad - grads[n].grad).abs().max() / (grads[n].grad.abs().max() + 1e-6))
                               for n, p in swapped.named_parameters())
print(json.dumps({"results": results, "backends": backends}))
"""


def test_triton_backend_equals_the_loop_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["backends"] == ["triton"]
    for case, error in report["results"].items():
        limit = 2e-2 if case.startswith("bfloat16") else 1e-5
        assert error < limit, (case, error, report)
