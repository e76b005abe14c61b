"""Bounds on the size and shape of a raw config, checked before anything else looks at it.

A config file comes from outside and may be hostile or broken: nested thousands of levels deep
(RecursionError in the parser), a 5000-digit integer (ValueError in int()), hundreds of thousands
of keys (seconds of key suggestions), NaN / Infinity literals (not JSON at all). Real DeepSpeed
configs are a few KB, nest at most 8 levels and hold at most a few hundred values, so the limits
below leave two orders of magnitude of room and make every later stage bounded in time.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from .errors import Problem

MAX_TEXT_BYTES = 1 << 20  # 1 MiB; real configs are a few KB
MAX_DEPTH = 32  # nested objects / lists; real configs nest at most 8
MAX_VALUES = 10_000  # every key's value and list item, at any depth; real configs hold at most a few hundred
MAX_KEY_CHARS = 256
MAX_STRING_CHARS = 65_536
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_INT_DIGITS = 19  # int64 has at most 19 digits; longer literals are not even converted (int() is quadratic)

_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
# A JSON string (a key when a colon follows), an opening or closing bracket, or a comma.
JSON_TOKEN = re.compile(rf'({_STRING})(\s*:)?|([{{\[])|([}}\]])|(,)', re.DOTALL)
_STRINGS = re.compile(_STRING, re.DOTALL)
_NOT_BRACKETS = re.compile(r'[^\[\]{}]+')
_DEPTH_STEP = {"{": 1, "[": 1, "}": -1, "]": -1}


class BadNumber:
    """A number literal the parser met that no config can hold; `shape_problems` reports it by path."""

    def __init__(self, literal: str, reason: str):
        self.literal, self.reason = literal, reason

    def __repr__(self) -> str:
        return self.literal


def parse_int(literal: str) -> int | BadNumber:
    digits = len(literal.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        return BadNumber(literal, f"an integer of {digits} digits does not fit in 64 bits "
                                  f"(valid: {INT64_MIN} .. {INT64_MAX})")
    return int(literal)


def parse_float(literal: str) -> float | BadNumber:
    value = float(literal)
    if not math.isfinite(value):
        return BadNumber(literal, "is too large for a 64-bit float (at most about 1.8e308); write a finite number")
    return value


def parse_constant(literal: str) -> BadNumber:
    return BadNumber(literal, "is not valid JSON (NaN and Infinity are JavaScript literals) and not a usable "
                              "setting; write a finite number")


def text_size_problem(size: int, unit: str = "bytes", limit: int = MAX_TEXT_BYTES) -> Problem | None:
    if size <= limit:
        return None
    return Problem("", f"the config is {size} {unit} long; dsconfig reads at most {limit} {unit} "
                       f"(real configs are a few KB)")


def nesting_problem(text: str) -> Problem | None:
    """The first place where `text` nests deeper than MAX_DEPTH, found without recursion (before parsing).

    Strings are skipped whole, so brackets inside them do not count; keys and list indices are
    tracked so that the message names the path, as for every other problem.
    """
    if text.count("{") + text.count("[") <= MAX_DEPTH:
        return None
    # The depth in C-speed steps (regex, map, accumulate); the slower path-tracking scan runs only on refusal.
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    if max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) <= MAX_DEPTH:
        return None
    stack: list[str | int | None] = []  # per open container: the current key (object) or index (list)
    for match in JSON_TOKEN.finditer(text):
        string, colon, opener, closer, comma = match.groups()
        if opener:
            stack.append(None if opener == "{" else 0)
            if len(stack) > MAX_DEPTH:
                return Problem(_shorten(_path_of(stack[:-1])), f"nests deeper than {MAX_DEPTH} levels of objects "
                                                               f"and lists (real configs nest at most 8)")
        elif closer:
            if stack:
                stack.pop()
        elif comma:
            if stack and isinstance(stack[-1], int):
                stack[-1] += 1
        elif string and colon and stack and not isinstance(stack[-1], int):
            stack[-1] = string
    return None


def _path_of(stack: list[str | int | None]) -> str:
    path = ""
    for step in stack:
        if isinstance(step, int):
            path += f"[{step}]"
        elif step is not None:
            try:
                key = json.loads(step)
            except ValueError:
                key = step
            path = f"{path}.{key}" if path else key
    return path


def _shorten(path: str, limit: int = 200) -> str:
    return path if len(path) <= limit else f"{path[:limit // 2]}...{path[-limit // 2:]}"


def shape_problems(data: Any) -> list[Problem]:
    """Problems of a parsed (or given) config with limits: depth, value count, key and string length,
    integers beyond int64, non-finite floats and the BadNumber literals of the parser. Iterative, and it
    stops after MAX_VALUES values, so it is bounded in time whatever `data` is (even self-referencing)."""
    problems: list[Problem] = []
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    count = 0  # values met so far: counted before they are expanded, so a huge dict costs nothing
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                problems.append(Problem(_shorten(path), f"nests deeper than {MAX_DEPTH} levels of objects and lists "
                                                        f"(real configs nest at most 8)"))
                continue
            count += len(value)
            if count > MAX_VALUES:
                return [Problem("", f"holds more than {MAX_VALUES} values (keys and list items); real configs "
                                    f"hold a few hundred")]
            stack.extend(reversed(_children(value, path, depth, problems)))
        elif isinstance(value, BadNumber):
            problems.append(Problem(path, value.reason, value))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            problems.append(Problem(path, f"does not fit in a 64-bit integer (valid: {INT64_MIN} .. {INT64_MAX})",
                                    value))
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(Problem(path, "must be a finite number (NaN and infinity are not valid)", value))
        elif isinstance(value, str) and len(value) > MAX_STRING_CHARS:
            problems.append(Problem(path, f"is a string of {len(value)} characters; at most {MAX_STRING_CHARS} "
                                          f"are accepted", value))
    return problems


def _children(value: dict | list | tuple, path: str, depth: int, problems: list[Problem]) -> list:
    if not isinstance(value, dict):
        return [(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    children = []
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(Problem(path, f"has a key that is not a string: {key!r} ({type(key).__name__})"))
        elif len(key) > MAX_KEY_CHARS:
            problems.append(Problem(_shorten(f"{path}.{key}" if path else key, 80),
                                    f"is a key of {len(key)} characters; at most {MAX_KEY_CHARS} are accepted"))
        else:
            children.append((item, f"{path}.{key}" if path else key, depth + 1))
    return children
