"""How attention heads are split over the sequence ranks (pure arithmetic, no torch).

Ulysses gives each of the `sp` ranks whole heads of the whole sequence. Query heads split evenly. With
grouped-query attention the key/value heads split by their groups: rank r's query heads
[r*q/sp, (r+1)*q/sp) read key/value heads [r*kv/sp, (r+1)*kv/sp) when sp divides kv; when kv divides
sp, each key/value head is repeated sp/kv times first, so every rank holds the one its query heads read.
Any other count would split a group across ranks, and is refused with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SequenceParallelError


@dataclass(frozen=True)
class HeadSplit:
    """One rank's share of the heads: `local_q` query and `local_kv` key/value heads, after repeating
    each key/value head `kv_repeat` times (1: no repeat)."""

    q_heads: int
    kv_heads: int
    sp: int
    local_q: int
    local_kv: int
    kv_repeat: int

    @property
    def local_groups(self) -> int:
        """Query heads per key/value head on one rank (the local attention's GQA factor)."""
        return self.local_q // self.local_kv


def split_heads(q_heads: int, kv_heads: int, sp: int, where: str = "attention") -> HeadSplit:
    """The head split of `q_heads` query and `kv_heads` key/value heads over `sp` sequence ranks, or a
    SequenceParallelError naming `where`, the numbers and what would be valid."""
    for name, value in (("query heads", q_heads), ("key/value heads", kv_heads), ("sequence-parallel size", sp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SequenceParallelError(f"{where}: {name} must be a positive integer, got {value!r}")
    if q_heads % kv_heads:
        raise SequenceParallelError(f"{where}: {q_heads} query heads are not a multiple of {kv_heads} key/value "
                                    f"heads, so they do not form groups")
    if q_heads % sp:
        valid = [d for d in range(1, q_heads + 1) if q_heads % d == 0]
        raise SequenceParallelError(f"{where}: {q_heads} query heads do not split evenly over sequence-parallel "
                                    f"size {sp}; Ulysses gives each rank whole heads, so the size must divide the "
                                    f"head count: one of {valid}")
    if kv_heads % sp == 0:
        return HeadSplit(q_heads, kv_heads, sp, q_heads // sp, kv_heads // sp, 1)
    if sp % kv_heads == 0:
        return HeadSplit(q_heads, kv_heads, sp, q_heads // sp, 1, sp // kv_heads)
    raise SequenceParallelError(f"{where}: {kv_heads} key/value heads neither split over nor divide "
                                f"sequence-parallel size {sp}, so a rank's query heads would need part of a "
                                f"group's key/value head; use a size that divides {kv_heads} or that {kv_heads} "
                                f"divides")
