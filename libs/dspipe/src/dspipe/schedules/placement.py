"""Which pipeline rank holds which stage.

Two shapes cover every schedule here:
- "loop": stage s on rank s % p. One stage per rank for gpipe/1f1b/zb_h1/inference; rank r holds
  r, r+p, r+2p, ... for interleaved 1F1B (Megatron's and torch's virtual stages).
- "v": 2p stages, rank r holds stage r and stage 2p-1-r, so the first and the last stage sit on rank 0
  and the turn of the V (stages p-1 and p) on rank p-1 (ZB-V, DualPipeV).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError

SHAPES = ("loop", "v")


@dataclass(frozen=True, slots=True)
class Placement:
    """`rank_of[s]` is the pipeline rank that holds stage s."""

    shape: str
    ranks: int
    rank_of: tuple[int, ...]

    @property
    def stages(self) -> int:
        return len(self.rank_of)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages rank `rank` holds, lowest first."""
        if not 0 <= rank < self.ranks:
            raise ScheduleError(f"rank {rank} is outside the pipeline's ranks 0..{self.ranks - 1}")
        return tuple(s for s, r in enumerate(self.rank_of) if r == rank)

    def same_rank(self, stage_a: int, stage_b: int) -> bool:
        return self.rank_of[stage_a] == self.rank_of[stage_b]

    @property
    def first_stage_rank(self) -> int:
        return self.rank_of[0]

    @property
    def last_stage_rank(self) -> int:
        """The rank computing the loss."""
        return self.rank_of[-1]


def make_placement(shape: str, ranks: int, stages: int) -> Placement:
    """The placement of `stages` stages on `ranks` ranks in the given shape ("loop" or "v")."""
    _check_positive("ranks", ranks)
    _check_positive("stages", stages)
    if shape == "loop":
        if stages % ranks:
            raise ScheduleError(f"a loop placement needs stages ({stages}) to be a multiple of ranks ({ranks}), "
                                f"so every rank holds the same number of stages")
        return Placement("loop", ranks, tuple(s % ranks for s in range(stages)))
    if shape == "v":
        if stages != 2 * ranks:
            raise ScheduleError(f"a V placement holds two stages per rank: stages must be 2 * ranks = {2 * ranks}, "
                                f"got {stages}")
        return Placement("v", ranks, tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(stages)))
    raise ScheduleError(f"unknown placement shape {shape!r}; valid: {', '.join(SHAPES)}")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"{name} must be an int >= 1, got {value!r}")
