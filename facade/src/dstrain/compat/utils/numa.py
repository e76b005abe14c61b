"""`deepspeed.utils.numa`: the core-list parser behind `--bind_core_list` (dstrain's launcher, which binds each rank
to its share of the cores itself: facade/src/dstrain/launcher/_cores.py)."""

from __future__ import annotations

import itertools

from ...launcher._cores import LIST_RULE, parse_core_list


def parse_range_list(range_str: str) -> list[int]:
    """'0,2-4,6' -> [0, 2, 3, 4, 6]: core numbers and ranges in ascending order, none repeated. A ValueError names
    a bad item, a range that ends before it starts, a repeated core, or a core below one listed before it."""
    cores = parse_core_list(range_str, "core list")
    for before, after in itertools.pairwise(cores):
        if after < before:
            raise ValueError(f"core list {range_str!r}: core {after} comes after {before}; list cores in ascending "
                             f"order ({LIST_RULE})")
    return cores


__all__ = ["parse_range_list"]
