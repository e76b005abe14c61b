"""The rank-by-step grid that schedule errors print: one row per rank, one column per position in the
rank's list, the faulty cells in brackets ([1B3]) with a legend below."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MAX_COLUMNS = 40  # wider grids are cut to a window around the marked cells


def render_grid(schedule: Sequence[Sequence[object]], marks: Mapping[tuple[int, int], str]) -> str:
    """`marks` maps (rank, step) to a short reason; those cells are bracketed and listed."""
    width = max((len(str(a)) for actions in schedule for a in actions), default=1) + 2
    steps = max((len(actions) for actions in schedule), default=0)
    first, last = _window(steps, [step for _, step in marks])
    header = "step    " + "".join(str(step).center(width) for step in range(first, last))
    lines = [header]
    for rank, actions in enumerate(schedule):
        cells = []
        for step in range(first, last):
            text = str(actions[step]) if step < len(actions) else ""
            cells.append((f"[{text}]" if (rank, step) in marks else f" {text} ").center(width))
        lines.append(f"rank {rank:<3}" + ("... " if first else "") + "".join(cells).rstrip()
                     + (" ..." if last < len(actions) else ""))
    if first or last < steps:
        lines.append(f"(steps {first}..{last - 1} of 0..{steps - 1} shown)")
    for (rank, step), reason in sorted(marks.items()):
        lines.append(f"[{schedule[rank][step] if step < len(schedule[rank]) else '?'}] rank {rank} step {step}: {reason}")
    return "\n".join(lines)


def _window(steps: int, marked: list[int]) -> tuple[int, int]:
    if steps <= MAX_COLUMNS or not marked:
        return 0, min(steps, MAX_COLUMNS) if marked else steps
    center = min(marked)
    first = max(0, min(center - MAX_COLUMNS // 4, steps - MAX_COLUMNS))
    return first, min(steps, first + MAX_COLUMNS)
