"""What dsconfig reports: every problem of a config at once, each with its dotted path."""

from __future__ import annotations

from typing import Any

import attrs

_NO_VALUE = object()


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
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


class ConfigWarning(UserWarning):
    """A config that loads, but with something the user should know about (renamed, ignored, unknown keys)."""
