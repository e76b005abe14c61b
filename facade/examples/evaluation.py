"""Validation loss of an engine over a few batches of a dataset, shared by the example scripts."""

import torch


@torch.no_grad()
def evaluate(engine, dataset, batches: int = 8, loss_of=None) -> float:
    """`loss_of(engine, batch)` gives a batch's loss; by default `engine(batch)` (the examples' own models)."""
    loss_of = loss_of or (lambda engine, batch: engine(batch))
    engine.eval()
    loader = engine.deepspeed_io(dataset, route="eval")
    losses = [loss_of(engine, batch.to(engine.device)).item() for _, batch in zip(range(batches), loader)]
    engine.train()
    return sum(losses) / max(len(losses), 1)
