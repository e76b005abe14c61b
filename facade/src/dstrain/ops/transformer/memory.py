"""Counting the activation memory a forward pass keeps for backward, with saved-tensor hooks.

Each saved tensor is charged its whole storage, once per storage (views such as Q, K and V of one buffer
count once); parameters' storages are not activations and are left out. Works on any device.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch


class SavedActivations:
    """What a block of code saved for backward: `bytes` in all, `by_shape` in detail."""

    def __init__(self, excluded_storages: set[int]):
        self._excluded = excluded_storages
        self._seen: dict[int, tuple[tuple[int, ...], torch.dtype, int]] = {}

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._excluded and key not in self._seen:
            self._seen[key] = (tuple(tensor.shape), tensor.dtype, storage.nbytes())
        return tensor

    @property
    def bytes(self) -> int:
        return sum(nbytes for _, _, nbytes in self._seen.values())

    @property
    def by_shape(self) -> list[tuple[tuple[int, ...], torch.dtype, int]]:
        return sorted(self._seen.values(), key=lambda item: -item[2])


@contextmanager
def count_saved_activations(parameters: Iterable[torch.Tensor] = ()):
    """Inside the block, record every tensor autograd saves; `parameters`' storages are not counted.

        with count_saved_activations(layer.parameters()) as saved:
            out = layer(x)
        print(saved.bytes)
    """
    saved = SavedActivations({p.untyped_storage().data_ptr() for p in parameters})
    with torch.autograd.graph.saved_tensors_hooks(saved._pack, lambda tensor: tensor):
        yield saved
