"""A tiny model trained by dszero, eagerly or through dscompile, for the tests on real gloo ranks."""

from __future__ import annotations

import logging

import torch
from torch import nn

import dscompile
import dsconfig
import dszero


class EagerLinear(nn.Linear):
    """A layer torch.compile must leave to eager code (its forward is disabled)."""

    @torch._dynamo.disable
    def forward(self, x):
        return super().forward(x)


class Tiny(nn.Module):
    def __init__(self, eager_layer: bool = False, graph_break: bool = False, attention: bool = False):
        super().__init__()
        self.graph_break = graph_break
        self.attention = attention  # causal self-attention over the tokens, 2 heads, no weights of its own
        self.embed = nn.Embedding(32, 16)
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 64)
        self.down = (EagerLinear if eager_layer else nn.Linear)(64, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.attention:
            heads = x.unflatten(-1, (2, 8)).transpose(1, 2)
            x = x + nn.functional.scaled_dot_product_attention(heads, heads, heads, is_causal=True).transpose(
                1, 2).flatten(-2)
        h = torch.relu(self.up(self.norm(x)))
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.head(x + self.down(h))


def train(rank: int, *, stage: int, compiled: bool, steps: int = 3, gas: int = 2, settings: dict | None = None,
          schedule=None, budgets=None, backend: str = "aot_eager", model: dict | None = None,
          clip: float = 0.0, precision: str = "fp32") -> dict:
    """Losses, gathered parameters and the runtime's counts of `steps` optimizer steps of `gas` micro-steps."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Tiny(**(model or {}))
    if precision != "fp32":
        net = net.to({"bf16": torch.bfloat16, "fp16": torch.float16}[precision])
    zero = dszero.ZeroOptimizer(net, torch.optim.AdamW(net.parameters(), lr=1e-2),
                                dsconfig.ZeroConfig(stage=stage, stage3_param_persistence_threshold=0),
                                gradient_clipping=clip, precision=precision)
    runtime = None
    log = []
    if compiled:
        handler = _ListHandler(log)
        logging.getLogger("dscompile").addHandler(handler)
        logging.getLogger("dscompile").setLevel(logging.INFO)
        runtime = dscompile.deepcompile(net, zero, dsconfig.CompileConfig(deepcompile=True, **(settings or {})),
                                        backend=backend, schedule=schedule, budgets=budgets)
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(steps):
        for _ in range(gas):
            tokens = torch.randint(0, 32, (4, 9), generator=generator)
            logits = net(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
            zero.backward(loss / gas)
            losses.append(loss.item())
        zero.step()
        zero.zero_grad()
    with dszero.GatheredParameters(list(net.parameters())):
        params = [p.detach().clone() for p in net.parameters()]
    result = {"losses": losses, "params": params, "stats": dict(runtime.stats) if runtime else {},
              "log": log}
    if runtime is not None:
        result.update(peak_ahead=runtime.peak_ahead, peak_gathered=runtime.peak_gathered,
                      kept_bytes=sum(runtime.unit_slots[k].nbytes for k in runtime.kept_units),
                      fell_back=runtime.fell_back, unit_bytes=[u.nbytes for u in runtime.unit_slots.values()])
        logging.getLogger("dscompile").removeHandler(handler)
        dscompile.uncompile(runtime)
    return result


class _ListHandler(logging.Handler):
    def __init__(self, sink: list):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


def assert_same_training(eager: dict, compiled: dict, rtol: float = 1e-5) -> None:
    torch.testing.assert_close(torch.tensor(compiled["losses"]), torch.tensor(eager["losses"]), rtol=rtol, atol=0)
    for got, want in zip(compiled["params"], eager["params"], strict=True):
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-7)
