"""A data loader driven by a `DataSampler`: micro-batches of this rank's samples of each global batch,
an optional post-processing function (the seqlen curriculum truncates there), and a state that is the
sampler's as of the last batch handed out.

A torch DataLoader with worker processes asks its batch sampler for batches ahead of use, so the
sampler's own state runs ahead of training; a checkpoint of it would skip those batches on resume
(DeepSpeed's does). Here the sampler's state is recorded as each batch's indices are drawn and handed
out with that batch, so `state_dict()` always describes exactly the batches training consumed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from .data_sampler import DataSampler


class SampledDataLoader:
    """Micro-batches of `dataset` drawn by `data_sampler`; `post_process_func(batch, sampler_state)`, when
    set, transforms each batch (DeepSpeed passes the sampler's state_dict, with "current_difficulties")."""

    def __init__(self, dataset: Any, data_sampler: DataSampler, *, collate_fn: Callable | None = None,
                 num_workers: int = 0, pin_memory: bool = False, post_process_func: Callable | None = None):
        self.dataset = dataset
        self.data_sampler = data_sampler
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.post_process_func = post_process_func
        self.batch_size = data_sampler.micro_batch_size
        self._drawn: deque[dict] = deque()  # the sampler's state after each batch drawn and not yet handed out
        self._state = data_sampler.state_dict()
        self._iterator: Iterator | None = None

    def __len__(self) -> int:
        return len(self.data_sampler)

    def __iter__(self) -> SampledDataLoader:
        if self._iterator is None:
            self._iterator = iter(DataLoader(self.dataset, batch_sampler=self._recorded_batches(),
                                             collate_fn=self.collate_fn, num_workers=self.num_workers,
                                             pin_memory=self.pin_memory))
        return self

    def __next__(self) -> Any:
        iter(self)
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._iterator = None
            raise
        self._state = self._drawn.popleft()
        if self.post_process_func is not None:
            batch = self.post_process_func(batch, self._state)
        return batch

    def _recorded_batches(self) -> _Recorded:
        return _Recorded(self.data_sampler, self._drawn)

    def state_dict(self) -> dict:
        """The sampler's state after the last batch handed out."""
        return self._state

    def load_state_dict(self, state: dict) -> None:
        self.data_sampler.load_state_dict(state)
        self._state = self.data_sampler.state_dict()
        self._drawn.clear()
        self._iterator = None

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict: dict) -> None:
        self.data_sampler.set_custom_curriculum_learning_schedule(schedule_func_dict)


class _Recorded:
    """The sampler's batches, each recording the sampler's state right after it was drawn."""

    def __init__(self, sampler: DataSampler, drawn: deque):
        self.sampler, self.drawn = sampler, drawn

    def __iter__(self) -> Iterator[list[int]]:
        for indices in self.sampler:
            self.drawn.append(self.sampler.state_dict())
            yield indices

    def __len__(self) -> int:
        return len(self.sampler)
