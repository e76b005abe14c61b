"""What dsconfig reports: every problem of a config at once, each with its dotted path."""

from __future__ import annotations

from typing import Any

import attrs

_NO_VALUE = object()
# A message lists this many problems (or warned-about keys) and counts the rest: a hostile file
# with thousands of unknown keys must not produce a megabyte of text.
LISTED = 30


@attrs.frozen
class Problem:
    """One thing wrong with a config: where, what was there, and what would be valid."""

    path: str
    message: str
    value: Any = _NO_VALUE

    def __str__(self) -> str:
        where = self.path or "<config>"
        if self.value is _NO_VALUE:
            return f"{where}: {self.message}"
        return f"{where} = {_short_repr(self.value)}: {self.message}"


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(ValueError):
    """A config that cannot be used as it is. `problems` lists every problem found."""

    def __init__(self, problems: list[Problem] | Problem | str, *, source: str | None = None):
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        self.source = source
        super().__init__(self._render())

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.problems]

    def _render(self) -> str:
        origin = f" in {self.source}" if self.source else ""
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in the DeepSpeed config{origin}:"
        lines = [head, *(f"  - {p}" for p in self.problems[:LISTED])]
        if count > LISTED:
            lines.append(f"  ... and {count - LISTED} more")
        return "\n".join(lines)


def listing(entries: list[str]) -> str:
    """`entries` joined with "; ", the first LISTED of them, then how many more there are."""
    shown = "; ".join(entries[:LISTED])
    return shown if len(entries) <= LISTED else f"{shown}; and {len(entries) - LISTED} more"


class ConfigWarning(UserWarning):
    """A config that loads, but with something the user should know about (renamed, ignored, unknown keys)."""
