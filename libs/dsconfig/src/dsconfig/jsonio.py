"""Reading a config source: a JSON file, a dict, or base64-encoded JSON (as DeepSpeed's launcher passes it).

Strict JSON only, with errors that say what is wrong in terms people use: duplicate keys with
both line numbers, // comments, trailing commas, and unfilled template placeholders.
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


def read_source(source: Any) -> tuple[dict, str | None]:
    """(raw config dict, a name for messages) from a path, a dict or a base64 string."""
    if isinstance(source, dict):
        return source, None
    if isinstance(source, (str, os.PathLike)):
        text_source = os.fspath(source)
        if os.path.isfile(text_source):
            try:
                with open(text_source, encoding="utf-8") as handle:
                    text = handle.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read {text_source}: {exc}", source=text_source) from None
            return parse_json(text, text_source), text_source
        if isinstance(source, str):
            decoded = _maybe_base64(source)
            if decoded is not None:
                return parse_json(decoded, "<base64 config>"), "<base64 config>"
            if source.lstrip().startswith("{"):
                return parse_json(source, "<JSON text>"), "<JSON text>"
        raise ConfigError(f"no such config file: {text_source} (a path to a JSON file, a dict, or base64-encoded "
                          f"JSON is expected)", source=text_source)
    raise ConfigError(f"a config is a path, a dict or a base64 string, not {type(source).__name__}")


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
    try:
        # The C parser first; only a file with a repeated key pays for the slower one that finds lines.
        data = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey:
        data = None
    except json.JSONDecodeError as exc:
        raise ConfigError(Problem("", _explain_json_error(text, exc)), source=name) from None
    if data is not None:
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


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _DuplicateKey("", 0, 0)
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
        super().__init__()
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
    lines, depth, pos = [], 0, start
    needle = json.dumps(key)
    while pos < end and len(lines) < 2:
        char = text[pos]
        if char == '"':
            close = pos + 1
            while close < end and text[close] != '"':
                close += 2 if text[close] == "\\" else 1
            if depth == 0 and text[pos:close + 1] == needle and re.match(r"\s*:", text[close + 1:]):
                lines.append(text.count("\n", 0, pos) + 1)
            pos = close + 1
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        pos += 1
    while len(lines) < 2:
        lines.append(0)
    return lines[0], lines[1]
