"""Shared by the multi-rank tests: small float64 models as layer lists, their data, and a reference
that trains the same layers unpipelined in one process (the truth every schedule must equal)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import dscomm
from dspipe import DualPipeVModule, LayerSpec, PipelineModule, TiedLayerSpec
from dspipe.runtime import AveragedOptimizer, PipelineRuntime

WIDTH, MICRO_BATCH, LR = 6, 3, 0.05


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def mlp_layers(depth: int = 8) -> list[Any]:
    """Linear + Tanh pairs as LayerSpecs, with one parameter-free function in the middle."""
    layers: list[Any] = []
    for index in range(depth):
        layers.append(LayerSpec(nn.Linear, WIDTH, WIDTH))
        layers.append(nn.Tanh() if index % 2 else torch.sin)
    return layers


def batch(step: int, replica: int, micro: int, seq: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 100 * replica + micro)
    shape = (MICRO_BATCH, WIDTH) if seq is None else (MICRO_BATCH, seq, WIDTH)
    return (torch.randn(shape, generator=gen, dtype=torch.float64),
            torch.randn(shape, generator=gen, dtype=torch.float64))


def varying_seq(step: int, replica: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batches of different sequence lengths (3 .. 6), as variable-length text gives."""
    return batch(step, replica, micro, seq=3 + (step + micro) % 4)


VOCAB = 11


def token_batch(step: int, replica: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 100 * replica + micro)
    return torch.randint(0, VOCAB, (MICRO_BATCH, 4), generator=gen), torch.randint(0, VOCAB, (MICRO_BATCH, 4),
                                                                                  generator=gen)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def build(layers: list[Any], stages: int | None, schedule: str, *, dims: Any = None, **kwargs: Any) -> PipelineModule:
    kind = DualPipeVModule if schedule in ("zbv", "dualpipev") else PipelineModule
    if schedule == "interleaved_1f1b":
        kwargs.setdefault("chunks", 2)
    kwargs.setdefault("seed_layers", True)
    module = kind(layers, num_stages=stages, topology=dims, loss_fn=kwargs.pop("loss_fn", mse),
                  partition_method=kwargs.pop("partition_method", "uniform"), **kwargs)
    return module.double()


class RecordingSync(AveragedOptimizer):
    """The plain optimizer seam, keeping each step's averaged gradients by parameter name."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, group: Any):
        super().__init__(optimizer, group)
        self.names = {id(p): n for n, p in module.named_parameters()}
        self.grads: list[dict[str, torch.Tensor]] = []

    def finish_backward(self) -> None:
        already = self._reduced
        super().finish_backward()
        if not already:
            self.grads.append({self.names[id(p)]: p.grad.detach().clone()
                               for g in self.optimizer.param_groups for p in g["params"]})


def train_pipelined(groups: Any, module: PipelineModule, schedule: str, steps: int, micro: int,
                    data: Any = None) -> dict[str, Any]:
    """Train on this rank; returns losses, each step's gradients and the final parameters by name."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.01)
    sync = RecordingSync(module, optimizer, groups.data)
    runtime = PipelineRuntime(module, groups, schedule)
    replica = groups.rank_in("data")
    losses = []
    for step in range(steps):
        batches = iter([(data or batch)(step, replica, m) for m in range(micro)])
        losses.append(runtime.train_batch(batches, sync, micro).item())
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    return {"losses": losses, "grads": sync.grads, "params": params}


def train_reference(layers: list[Any], steps: int, micro: int, replicas: int, data: Any = None,
                    **kwargs: Any) -> dict[str, Any]:
    """The same layers as one stage in this process: every replica's micro-batches, averaged."""
    module = build(layers, None, "1f1b", dims=dscomm.ParallelDims(1), **kwargs)
    optimizer = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.01)
    losses, grads = [], []
    for step in range(steps):
        total = 0.0
        for replica in range(replicas):
            for m in range(micro):
                x, y = (data or batch)(step, replica, m)
                loss = module.loss_fn(module(x), y) / (micro * replicas)
                loss.backward()
                total += loss.item()
        grads.append({n: p.grad.detach().clone() for n, p in module.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in module.named_parameters()}}


def assert_matches(got: dict[str, Any], want: dict[str, Any], loss_rank: bool, what: str) -> None:
    if loss_rank:
        torch.testing.assert_close(got["losses"], want["losses"], rtol=1e-12, atol=0, msg=lambda m: f"{what}: {m}")
    for step, grads in enumerate(got["grads"]):
        for name, grad in grads.items():
            torch.testing.assert_close(grad, want["grads"][step][name], rtol=1e-10, atol=1e-13,
                                       msg=lambda m, n=name, s=step: f"{what}: gradient of {n} at step {s}: {m}")
    for name, param in got["params"].items():
        torch.testing.assert_close(param, want["params"][name], rtol=1e-10, atol=1e-13,
                                   msg=lambda m, n=name: f"{what}: parameter {n}: {m}")


def tied_layers() -> list[Any]:
    """An embedding whose weight is also the output projection (forward_fn), Linear layers between."""
    def project(embedding: nn.Embedding, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ embedding.weight.t()

    layers: list[Any] = [TiedLayerSpec("embed", nn.Embedding, VOCAB, WIDTH)]
    for _ in range(4):
        layers += [LayerSpec(nn.Linear, WIDTH, WIDTH), nn.Tanh()]
    layers.append(TiedLayerSpec("embed", nn.Embedding, VOCAB, WIDTH, forward_fn=project))
    return layers
