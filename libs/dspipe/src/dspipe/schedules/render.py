"""Drawing a Timeline: text (one row per rank, `.` for idle) and PNG (written with zlib and struct)."""

from __future__ import annotations

import itertools
import math
import os
import struct
import zlib
from pathlib import Path

from .action import Kind
from .timeline import Timeline

LINE_WIDTH = 160
MAX_CELLS = 2000  # a measured trace with finer detail is drawn at makespan / MAX_CELLS per column


def render_text(timeline: Timeline, *, line_width: int = LINE_WIDTH) -> str:
    """One row per rank; each compute action's label (`F3`, or `2F3` when a rank holds several stages)
    starts its span, `-` fills the rest of it, `.` is idle time. Long timelines wrap into blocks of
    `line_width` characters.

    A column is the finest step between the actions' starts and ends when they lie on a grid (any
    simulation), else the shortest compute action (a measured trace), and never finer than
    makespan / MAX_CELLS; actions sharing a column then show the later one."""
    compute = [e for e in timeline.events if e.action.kind.is_compute and e.duration > 0]
    if not compute:
        return "(no compute actions)"
    shortest = min(e.duration for e in compute)
    edges = sorted({t for e in compute for t in (e.start, e.end)})
    finest = min([shortest] + [b - a for a, b in itertools.pairwise(edges) if b - a > 1e-9 * shortest])
    unit = max(finest if finest >= shortest / 4 else shortest, timeline.makespan / MAX_CELLS)
    columns = max(1, math.ceil(timeline.makespan / unit - 1e-9))
    several = len({e.action.stage for e in compute}) > timeline.ranks
    labels = {e: str(e.action) if several else f"{e.action.kind.value}{e.action.micro_batch}" for e in compute}
    width = max(len(label) for label in labels.values()) + 1
    grid = []
    for rank in range(timeline.ranks):
        cells = [". ".ljust(width)] * columns
        for event in (e for e in compute if e.rank == rank):
            first = min(columns - 1, round(event.start / unit))
            last = max(first + 1, min(columns, round(event.end / unit)))
            span = (last - first) * width
            text = labels[event][: span - 1].ljust(span - 1, "-") + " "
            for i in range(first, last):
                cells[i] = text[(i - first) * width:(i - first + 1) * width]
        grid.append(cells)
    per_block = max(1, (line_width - 10) // width)
    lines = []
    for first in range(0, columns, per_block):
        if first:
            lines.append(f"(from t = {first * unit:.6g})")
        lines += [f"rank {rank:<3}|" + "".join(cells[first:first + per_block]).rstrip()
                  for rank, cells in enumerate(grid)]
    lines.append(f"one column = {unit:.3g} time units; F forward, B backward, I input-gradient, W weight-gradient, "
                 f". idle")
    return "\n".join(lines)


# Colours by kind; anything else a rank does (waits, sends, the step) is drawn grey.
_COLOURS = {Kind.F: (66, 133, 244), Kind.B: (52, 168, 83), Kind.I: (142, 206, 160), Kind.W: (251, 188, 5)}
_OTHER, _IDLE, _INK, _RULE = (200, 200, 200), (255, 255, 255), (0, 0, 0), (225, 225, 225)
# 3x5 digits, a row of three bits per line, for micro-batch and rank numbers.
_DIGITS = ["111101101101111", "010110010010111", "111001111100111", "111001111001111", "101101111001001",
           "111100111001111", "111100111101111", "111001001001001", "111101111101111", "111101111001111"]


def render_png(timeline: Timeline, path: str | os.PathLike[str], *, width: int = 1200, row_height: int = 24) -> None:
    """Draw the timeline into a PNG at `path`: one band per rank, a box per action coloured by kind
    (F blue, B green, I light green, W yellow, others grey), micro-batch numbers in the boxes wide enough."""
    margin = 24
    scale = (width - margin - 4) / timeline.makespan if timeline.makespan else 1.0
    height = timeline.ranks * row_height + 4
    image = _Image(width, height)
    for rank in range(timeline.ranks):
        top = rank * row_height + 2
        image.text(4, top + (row_height - 10) // 2, str(rank), _INK)
        image.fill(margin, top + row_height - 1, width, top + row_height, _RULE)
        for event in (e for e in timeline.events if e.rank == rank and e.duration > 0):
            x0 = margin + int(event.start * scale)
            x1 = max(x0 + 1, margin + int(event.end * scale))
            colour = _COLOURS.get(event.action.kind, _OTHER)
            image.fill(x0, top + 1, x1 - 1, top + row_height - 2, colour)
            label = str(event.action.micro_batch) if event.action.kind.is_compute else ""
            if label and x1 - x0 >= 8 * len(label) + 2:
                image.text(x0 + 2, top + (row_height - 10) // 2, label, _INK)
    image.save(Path(path))


class _Image:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(_IDLE) * width) for _ in range(height)]

    def fill(self, x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        x0, x1 = max(0, x0), min(self.width, x1)
        if x1 <= x0:
            return
        run = bytes(colour) * (x1 - x0)
        for y in range(max(0, y0), min(self.height, y1)):
            self.rows[y][3 * x0:3 * x1] = run

    def text(self, x: int, y: int, digits: str, colour: tuple[int, int, int]) -> None:
        """Digits at 2x scale (6x10 pixels each, 8 apart)."""
        for n, char in enumerate(digits):
            glyph = _DIGITS[int(char)]
            for i, bit in enumerate(glyph):
                if bit == "1":
                    gx, gy = x + 8 * n + 2 * (i % 3), y + 2 * (i // 3)
                    self.fill(gx, gy, gx + 2, gy + 2, colour)

    def save(self, path: Path) -> None:
        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)  # filter type 0 on every scanline

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                         + chunk(b"IEND", b""))
