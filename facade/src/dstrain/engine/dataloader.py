"""The engine's data loader: each data-parallel rank reads its own part of the dataset in micro-batches,
and remembers where it is so a resumed run continues at the same sample."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset


class DeepSpeedDataLoader:
    """Micro-batches of `batch_size` from this rank's share of `dataset`.

    Each pass over the data (an epoch) uses a new shuffle of the sampler, and `state_dict()` holds
    the epoch and the number of batches already taken, so loading it restarts mid-epoch at exactly
    the next batch. A `data_sampler` of the caller's replaces the distributed sampler.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, rank: int, world_size: int, collate_fn=None,
                 num_workers: int = 0, drop_last: bool = False, data_sampler=None, shuffle: bool = True,
                 seed: int = 0, pin_memory: bool = False):
        if isinstance(dataset, IterableDataset):
            raise TypeError("training_data is an IterableDataset: the engine cannot split it over ranks; build "
                            "your own DataLoader that yields this rank's micro-batches and leave training_data=None")
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.pin_memory = pin_memory
        self.seed = seed
        self.sampler = data_sampler if data_sampler is not None else DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.epoch = 0
        self.batches_taken = 0  # in the current epoch
        self._iterator: Iterator | None = None

    def __len__(self) -> int:
        samples = len(self.sampler)
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def __iter__(self) -> DeepSpeedDataLoader:
        # A fresh iter() after a finished epoch starts the next one; mid-epoch (e.g. after a resume) it continues.
        if self._iterator is None:
            self._iterator = self._epoch_iterator()
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._epoch_iterator()
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._iterator = None
            self.epoch += 1
            self.batches_taken = 0
            raise
        self.batches_taken += 1
        return batch

    def _epoch_iterator(self) -> Iterator:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        indices = list(iter(self.sampler))[self.batches_taken * self.batch_size:]
        # The loader's own generator: creating an iterator must not draw from the global RNG, or a resumed
        # run (which creates one mid-epoch) would see different dropout masks than the original.
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=indices, collate_fn=self.collate_fn,
                            num_workers=self.num_workers, drop_last=self.drop_last, pin_memory=self.pin_memory,
                            generator=generator)
        return iter(loader)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_taken": self.batches_taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.batches_taken = int(state["batches_taken"])
        self._iterator = None


class RepeatingLoader:
    """Wraps a loader so iteration never ends: a finished epoch starts the next one (DeepSpeed's name)."""

    def __init__(self, loader):
        self.loader = loader
        self._iterator = iter(loader)

    def __iter__(self) -> RepeatingLoader:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.loader)
            return next(self._iterator)

