"""Reading a config source: a JSON file, a dict, or base64-encoded JSON (as DeepSpeed's launcher passes it).

JSON first; text that is not JSON is read as Hjson, as DeepSpeed reads every config (comments, unquoted keys
and strings, trailing or missing commas), so a file DeepSpeed accepts loads here. Text neither reads gets an
error that says what is wrong in terms people use: duplicate keys with both line numbers, unfilled template
placeholders, a missing ':'. Size, depth, number and key limits (limits.py) are checked before and while
parsing, so hostile input fails fast.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from json.decoder import JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from typing import Any

from .errors import ConfigError, Problem
from .limits import (
    JSON_TOKEN,
    MAX_TEXT_BYTES,
    nesting_problem,
    parse_constant,
    parse_float,
    parse_int,
    shape_problems,
    text_size_problem,
)

# A base64 source is 4/3 the size of the JSON it holds.
_MAX_SOURCE_CHARS = MAX_TEXT_BYTES * 4 // 3 + 4
_NUMBER_HOOKS = {"parse_int": parse_int, "parse_float": parse_float, "parse_constant": parse_constant}

# Accelerate's DeepSpeedPlugin writes `steps_per_print: inf` ("never") into the dict it hands DeepSpeed. It is
# the one non-finite value with a meaning, so it becomes a step count no run reaches; any other is refused.
STEPS_NEVER = 2**62


def _accelerate_idioms(source: dict) -> dict:
    """The dict Accelerate's DeepSpeedPlugin builds, in the terms DeepSpeed reads it: `steps_per_print: inf` is
    "never", and an offload section's `nvme_path: null` is "not given" (its default). A copy; the caller's
    dict is left as it is."""
    if source.get("steps_per_print") == float("inf"):
        source = {**source, "steps_per_print": STEPS_NEVER}
    zero = source.get("zero_optimization")
    if isinstance(zero, dict):
        for key in ("offload_param", "offload_optimizer"):
            offload = zero.get(key)
            if isinstance(offload, dict) and "nvme_path" in offload and offload["nvme_path"] is None:
                zero = {**zero, key: {k: v for k, v in offload.items() if k != "nvme_path"}}
        if zero is not source["zero_optimization"]:
            source = {**source, "zero_optimization": zero}
    return source


def read_source(source: Any) -> tuple[dict, str | None]:
    """(raw config dict, a name for messages) from a path, a dict or a base64 string."""
    if isinstance(source, dict):
        source = _accelerate_idioms(source)
        problems = shape_problems(source)
        if problems:
            raise ConfigError(problems)
        return source, None
    if isinstance(source, (str, os.PathLike)):
        text_source = os.fspath(source)
        if isinstance(text_source, str) and len(text_source) > _MAX_SOURCE_CHARS:
            raise ConfigError(text_size_problem(len(text_source), "characters", _MAX_SOURCE_CHARS))
        if os.path.isfile(text_source):
            return parse_json(_read_file(text_source), text_source), text_source
        if isinstance(source, str):
            decoded = _maybe_base64(source)
            if decoded is not None:
                return parse_json(decoded, "<base64 config>"), "<base64 config>"
            if source.lstrip().startswith("{"):
                return parse_json(source, "<JSON text>"), "<JSON text>"
        raise ConfigError(f"no such config file: {text_source} (a path to a JSON file, a dict, or base64-encoded "
                          f"JSON is expected)", source=text_source)
    raise ConfigError(f"a config is a path, a dict or a base64 string, not {type(source).__name__}")


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            too_big = text_size_problem(os.fstat(handle.fileno()).st_size)
            if too_big is not None:
                raise ConfigError(too_big, source=path)
            return handle.read(MAX_TEXT_BYTES + 1)  # bounded even if the file grows meanwhile
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", source=path) from None


def _maybe_base64(text: str) -> str | None:
    stripped = text.strip()
    if not stripped or len(stripped) % 4 or not re.fullmatch(r"[A-Za-z0-9+/=_-]+", stripped):
        return None
    try:
        decoded = base64.b64decode(stripped, altchars=b"-_" if "-" in stripped or "_" in stripped else None,
                                   validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return decoded if decoded.lstrip().startswith("{") else None


def parse_json(text: str, name: str) -> dict:
    # Limits first: the parsers recurse per nesting level and int() is quadratic in digits.
    too_big = text_size_problem(len(text), "characters")
    too_deep = nesting_problem(text) if too_big is None else None
    if too_big or too_deep:
        raise ConfigError(too_big or too_deep, source=name)
    repeated: list[bool] = []
    try:
        # The C parser first; only a file with a repeated key pays for the slower one that finds lines,
        # and only once the value limits hold (it is pure Python).
        data = json.loads(text, object_pairs_hook=lambda pairs: _note_repeats(pairs, repeated), **_NUMBER_HOOKS)
    except json.JSONDecodeError as exc:
        return _read_hjson(text, name, _explain_json_error(text, exc))
    except RecursionError:  # pragma: no cover - nesting_problem refuses such text first
        raise ConfigError(Problem("", "nests too deeply to parse"), source=name) from None
    problems = shape_problems(data)
    if problems:
        raise ConfigError(problems, source=name)
    if not repeated:
        return _require_object(data, name)
    try:
        data = _DuplicateRefusingDecoder().decode(text)
    except _DuplicateKey as dup:
        raise ConfigError(Problem(dup.path, f"appears twice in the same object (lines {dup.first_line} and "
                                            f"{dup.second_line}); JSON keeps only the last, so remove one"),
                          source=name) from None
    except json.JSONDecodeError as exc:  # pragma: no cover - the C parser raised it first
        raise ConfigError(Problem("", _explain_json_error(text, exc)), source=name) from None
    return _require_object(data, name)


def _read_hjson(text: str, name: str, not_json: str) -> dict:
    """`text`, which is not JSON (`not_json` says why), read as Hjson (DeepSpeed's reader) and checked as JSON is."""
    try:
        import hjson  # only text that is not JSON needs it (a machine without hjson still reads every JSON file)
    except ImportError:
        raise ConfigError(Problem("", f"{not_json}; DeepSpeed reads such files with hjson, which is not installed "
                                      f"here: pip install hjson"), source=name) from None
    try:
        data = hjson.loads(text, object_pairs_hook=_refuse_repeats, parse_int=parse_int, parse_float=parse_float)
    except ConfigError as exc:  # a repeated key, or a number past the limits (limits.parse_int / parse_float)
        raise ConfigError(exc.problems, source=name) from None
    except (hjson.HjsonDecodeError, ValueError, RecursionError):
        raise ConfigError(Problem("", not_json), source=name) from None
    problems = shape_problems(data)
    if problems:
        raise ConfigError(problems, source=name)
    return _require_object(data, name)


def _refuse_repeats(pairs: list[tuple[str, Any]]) -> dict:
    """Hjson's objects, a repeated key refused (Hjson gives no line numbers to name)."""
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ConfigError(Problem(key, "appears twice in the same object; DeepSpeed refuses that, so remove one"))
        result[key] = value
    return result


def _note_repeats(pairs: list[tuple[str, Any]], repeated: list[bool]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        repeated.append(True)
    return result


def _require_object(data: Any, name: str) -> dict:
    if not isinstance(data, dict):
        raise ConfigError(Problem("", f"the top level must be a JSON object {{...}}, not {type(data).__name__}"),
                          source=name)
    return data


def _explain_json_error(text: str, exc: json.JSONDecodeError) -> str:
    where = f"line {exc.lineno} column {exc.colno}"
    line = text.splitlines()[exc.lineno - 1] if text.splitlines() and exc.lineno <= len(text.splitlines()) else ""
    base = f"not valid JSON at {where} ({exc.msg})"
    if re.search(r"(^|\s)//|/\*", text):
        return f"{base}: the file has // or /* */ comments, which JSON does not allow; remove them " \
               f"(or use a \"_comment\" key)"
    if re.search(r",\s*[}\]]", text[max(0, exc.pos - 200): exc.pos + 5]):
        return f"{base}: a trailing comma before a closing bracket; remove it"
    # An unquoted word where a value belongs: a placeholder that sed / envsubst should have replaced.
    placeholder = re.match(r"\$\{?\w+\}?|[A-Za-z_]\w*", text[exc.pos:])
    if placeholder and placeholder.group(0) not in ("true", "false", "null"):
        return f"{base}: {placeholder.group(0)!r} looks like a template placeholder that a launch script " \
               f"fills in (sed / envsubst); fill it in before loading"
    stripped = text.strip()
    if stripped and not stripped.startswith("{"):
        return f"{base}: the text does not start with '{{'; is it a fragment of a config?"
    if re.search(r'"\s*=\s*', line):
        return f"{base}: use ':' between a key and its value, not '='"
    return base


class _DuplicateKey(ValueError):
    def __init__(self, path: str, first_line: int, second_line: int):
        super().__init__(path)
        self.path, self.first_line, self.second_line = path, first_line, second_line


class _DuplicateRefusingDecoder(json.JSONDecoder):
    """A JSONDecoder whose objects refuse repeated keys, reporting both lines and the dotted path."""

    def __init__(self) -> None:
        super().__init__(**_NUMBER_HOOKS)
        self._text = ""
        self.parse_object = self._parse_object
        self.scan_once = py_make_scanner(self)

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        self._text = s
        return super().decode(s, *args, **kwargs)

    def _parse_object(self, s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        start = s_and_end[1]
        pairs, end = JSONObject(s_and_end, strict, scan_once, None, lambda p: p, memo if memo is not None else {})
        seen: dict[str, int] = {}
        for index, (key, _) in enumerate(pairs):
            if key in seen:
                first, second = _key_lines(self._text, start, end, key)
                raise _DuplicateKey(key, first, second)
            seen[key] = index
        return dict(pairs), end


def _key_lines(text: str, start: int, end: int, key: str) -> tuple[int, int]:
    """Lines of the first two occurrences of `key` as a key directly inside the object text[start:end]."""
    lines, depth = [], 0
    for match in JSON_TOKEN.finditer(text, start, end):  # whole strings and brackets: linear in the text
        string, colon, opener, closer, _ = match.groups()
        if opener:
            depth += 1
        elif closer:
            depth -= 1
        elif string and colon and depth == 0 and json.loads(string) == key:
            lines.append(text.count("\n", 0, match.start()) + 1)
            if len(lines) == 2:
                break
    while len(lines) < 2:
        lines.append(0)
    return lines[0], lines[1]
