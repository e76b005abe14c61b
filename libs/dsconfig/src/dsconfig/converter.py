"""The one cattrs converter: strict JSON types in, frozen attrs sections out, every problem kept.

JSON is loose and Python's coercions are looser (`bool("false")` is True), so every scalar type
has a strict hook here: an int field takes 8 or 5e8 (integral) but not "8", 0.5 or true.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal, Union

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError

from .errors import Problem
from .limits import INT64_MAX, INT64_MIN


class BadValue(Exception):
    """A value that does not fit its declared type; `problems` may hold nested ones (lists, dicts)."""

    def __init__(self, message: str, value: Any, problems: list[Problem] | None = None):
        super().__init__(message)
        self.message = message
        self.value = value
        self.problems = problems or []


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _looks_like_search_space(value: Any) -> str:
    # Autotuning templates put lists of candidates where scalars go.
    return " (a list of candidates is an autotuning search space, not a value)" if isinstance(value, list) else ""


def _structure_bool(value: Any, _: type) -> bool:
    if isinstance(value, bool):
        return value
    hint = f'; write {value.lower()} without quotes' if isinstance(value, str) and value.lower() in ("true", "false") else ""
    raise BadValue(f"must be true or false, not {_json_type(value)}{hint}{_looks_like_search_space(value)}", value)


def _structure_int(value: Any, _: type) -> int:
    if isinstance(value, bool):
        raise BadValue("must be an integer, not a boolean", value)
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise BadValue("must be an integer (a whole number)", value)
        value = int(value)  # byte and element counts are often written 5e8
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:  # 1e300 is integral; no count or size is that large
            raise BadValue(f"is out of range; integers must fit in 64 bits ({INT64_MIN} .. {INT64_MAX})", value)
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        raise BadValue(f"must be a number, not a string; write {value.strip()} without quotes", value)
    raise BadValue(f"must be an integer, not {_json_type(value)}{_looks_like_search_space(value)}", value)


def _structure_float(value: Any, _: type) -> float:
    if isinstance(value, bool):
        raise BadValue("must be a number, not a boolean", value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise BadValue("must be a finite number", value)
        return float(value)
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            raise BadValue(f"must be a number, not a string; write {value.strip()} without quotes", value)
    raise BadValue(f"must be a number, not {_json_type(value)}{_looks_like_search_space(value)}", value)


def _structure_str(value: Any, _: type) -> str:
    if isinstance(value, str):
        return value
    raise BadValue(f"must be a string, not {_json_type(value)}", value)


def _structure_none(value: Any, _: type) -> None:
    if value is None:
        return None
    raise BadValue("must be null (the key is reserved for a future feature)", value)


def _is_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is Literal


def _structure_literal(value: Any, tp: Any) -> Any:
    choices = typing.get_args(tp)
    if not isinstance(value, bool):  # True == 1 in Python; a boolean is never a valid enum value
        for choice in choices:
            if value == choice and type(value) is type(choice):
                return choice
            if isinstance(value, str) and isinstance(choice, str) and _spelling(value) == choice.lower():
                return choice  # "Warn" / "warn", "FLOPS" / "flops": same meaning, canonical spelling
    valid = ", ".join(repr(c) if isinstance(c, str) else str(c) for c in choices)
    raise BadValue(f"must be one of {valid}{_looks_like_search_space(value)}", value)


def _spelling(text: str) -> str:
    """Case and a "torch." prefix do not change meaning: "torch.bfloat16" is "bfloat16"."""
    lowered = text.strip().lower()
    return lowered.removeprefix("torch.")


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _is_list(tp: Any) -> bool:
    return typing.get_origin(tp) is list


def _is_dict(tp: Any) -> bool:
    return typing.get_origin(tp) is dict


def _is_any(tp: Any) -> bool:
    return tp is Any


class _Converter:
    """Wraps one cattrs converter; hooks are registered once, at import."""

    def __init__(self) -> None:
        conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
        conv.register_structure_hook(bool, _structure_bool)
        conv.register_structure_hook(int, _structure_int)
        conv.register_structure_hook(float, _structure_float)
        conv.register_structure_hook(str, _structure_str)
        conv.register_structure_hook_func(lambda tp: tp is None or tp is type(None), _structure_none)
        conv.register_structure_hook_func(_is_any, lambda value, _: value)
        conv.register_structure_hook_func(_is_literal, _structure_literal)
        conv.register_structure_hook_func(_is_union, self._structure_union)
        conv.register_structure_hook_func(_is_list, self._structure_list)
        conv.register_structure_hook_func(_is_dict, self._structure_dict)
        self.cattrs = conv

    def _structure_union(self, value: Any, tp: Any) -> Any:
        members = typing.get_args(tp)
        if value is None:
            if type(None) in members:
                return None
            raise BadValue(f"must not be null; expected {_describe(tp)}", value)
        # Literal members first: "auto" must not be read as a plain string.
        ordered = sorted((m for m in members if m is not type(None)), key=lambda m: not _is_literal(m))
        errors: list[tuple[Any, BadValue]] = []
        for member in ordered:
            try:
                return self.cattrs.structure(value, member)
            except BadValue as exc:
                errors.append((member, exc))
        quoted = [e for m, e in errors if not _is_literal(m) and "without quotes" in e.message]
        if quoted:  # "true" or "8" in quotes: say so, it is the likely slip
            raise BadValue(f"{quoted[0].message}; expected {_describe(tp)}", value)
        if isinstance(value, str) and any(_is_literal(m) for m in members):
            raise BadValue(f"must be {_describe(tp)}", value)
        # The plain type's complaint ("must be an integer, not a list") says more than the placeholder's.
        member, error = next(((m, e) for m, e in errors if not _is_literal(m)), errors[0])
        raise BadValue(f"{error.message}, or {_describe_placeholders(tp)}", value, error.problems)

    def _structure_list(self, value: Any, tp: Any) -> list:
        if not isinstance(value, list):
            raise BadValue(f"must be a list, not {_json_type(value)}", value)
        (item_type,) = typing.get_args(tp) or (Any,)
        items, problems = [], []
        for index, item in enumerate(value):
            try:
                items.append(self.cattrs.structure(item, item_type))
            except Exception as exc:
                problems.extend(problems_from(exc, f"[{index}]"))
        if problems:
            raise BadValue("has invalid items", value, problems)
        return items

    def _structure_dict(self, value: Any, tp: Any) -> dict:
        if not isinstance(value, dict):
            raise BadValue(f"must be an object, not {_json_type(value)}", value)
        _, value_type = typing.get_args(tp) or (str, Any)
        result, problems = {}, []
        for key, item in value.items():
            try:
                result[key] = self.cattrs.structure(item, value_type)
            except Exception as exc:
                problems.extend(problems_from(exc, f".{key}"))
        if problems:
            raise BadValue("has invalid entries", value, problems)
        return result

    def structure(self, data: dict, cls: type) -> Any:
        return self.cattrs.structure(data, cls)

    def unstructure(self, obj: Any) -> Any:
        return self.cattrs.unstructure(obj)


def _describe(tp: Any) -> str:
    """A reader's name for a type: 'an integer or "auto"'."""
    if _is_literal(tp):
        return " or ".join(repr(c) if isinstance(c, str) else str(c) for c in typing.get_args(tp))
    if _is_union(tp):
        return " or ".join(_describe(m) for m in typing.get_args(tp))
    if _is_list(tp):
        return "a list"
    if _is_dict(tp):
        return "an object"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _describe_placeholders(tp: Any) -> str:
    others = [m for m in typing.get_args(tp) if _is_literal(m) or m is type(None)]
    return " or ".join(_describe(m) for m in others) if others else _describe(tp)


def problems_from(exc: BaseException, path: str) -> list[Problem]:
    """Flatten a cattrs exception tree (or one of our BadValue) into Problems with dotted paths."""
    if isinstance(exc, BadValue):
        if exc.problems:
            return [attrs.evolve(p, path=_join(path, p.path)) for p in exc.problems]
        return [Problem(path.lstrip("."), exc.message, exc.value)]
    if isinstance(exc, ForbiddenExtraKeysError):
        return [Problem(_join(path, f".{key}"), "unknown key") for key in sorted(exc.extra_fields)]
    if isinstance(exc, ClassValidationError):
        found: list[Problem] = []
        for sub in exc.exceptions:
            notes = [n for n in getattr(sub, "__notes__", []) if isinstance(n, AttributeValidationNote)]
            sub_path = _join(path, f".{notes[0].name}") if notes else path
            found.extend(problems_from(sub, sub_path))
        return found
    if isinstance(exc, KeyError):  # cattrs: a required key is absent
        return [Problem(path.lstrip("."), "is required")]
    return [Problem(path.lstrip("."), str(exc))]


def _join(prefix: str, suffix: str) -> str:
    if suffix and not suffix.startswith((".", "[")):
        suffix = "." + suffix
    return (prefix + suffix).lstrip(".")


CONVERTER = _Converter()
