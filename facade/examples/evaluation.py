"""Validation loss of an engine over a few batches of a dataset, shared by the example scripts."""

import torch


@torch.no_grad()
def evaluate(engine, dataset, batches: int = 8) -> float:
    engine.eval()
    loader = engine.deepspeed_io(dataset, route="eval")
    losses = [engine(batch.to(engine.device)).item() for _, batch in zip(range(batches), loader)]
    engine.train()
    return sum(losses) / max(len(losses), 1)
