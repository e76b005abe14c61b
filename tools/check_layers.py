#!/usr/bin/env python3
"""Checks that every library imports only the libraries below it, as noxfile.py's LAYERS says.

    python tools/check_layers.py [REPOSITORY_ROOT]

LAYERS is read by parsing noxfile.py (nox need not be installed). Every import in libs/<lib>/src
and facade/src (the dstrain facade), top-level or nested, `import x` or `from x import y`, and
`importlib.import_module("x")` with a literal name, of a library that LAYERS does not let it import
is printed as path:line with the rule, and the exit status is 1. So libraries on the same line never
import each other, and nothing imports dstrain. A library's benchmarks (libs/<lib>/bench,
facade/bench) follow its LAYERS line too, plus what noxfile.py's optional BENCH_LAYERS adds for it
(benchmarks that time what users run, through the facade). A library folder without a LAYERS line,
a LAYERS entry that depends on a library not listed above it, and a BENCH_LAYERS entry that names a
library LAYERS does not list, are errors too. Exit status 2: LAYERS or BENCH_LAYERS unreadable.
Standard library only.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FACADE = "dstrain"  # the one library that lives in facade/ rather than libs/<name>/


class LayersUnreadable(Exception):
    """noxfile.py has no LAYERS this tool can read."""


def read_layers(noxfile: Path, name: str = "LAYERS", required: bool = True) -> dict[str, set[str]]:
    """`name` (LAYERS, or BENCH_LAYERS) from noxfile.py: a dict literal of library name -> set literal (or
    set()) of library names. An absent dict that is not `required` reads as empty."""
    try:
        tree = ast.parse(noxfile.read_text(), str(noxfile))
    except (OSError, SyntaxError) as exc:
        raise LayersUnreadable(f"{noxfile}: cannot read it: {exc}") from exc
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(target, ast.Name) and target.id == name:
            return _layers_literal(node.value, noxfile, name)
    if not required:
        return {}
    raise LayersUnreadable(f"{noxfile}: no top-level `{name} = {{...}}` assignment")


def _layers_literal(value: ast.expr | None, noxfile: Path, name: str) -> dict[str, set[str]]:
    if not isinstance(value, ast.Dict):
        raise LayersUnreadable(f"{noxfile}: {name} must be a dict literal of library -> set of libraries")
    layers: dict[str, set[str]] = {}
    for key, deps in zip(value.keys, value.values):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise LayersUnreadable(f"{noxfile}:{deps.lineno}: every {name} key must be a library name string")
        if isinstance(deps, ast.Call) and isinstance(deps.func, ast.Name) and deps.func.id == "set" and not deps.args:
            layers[key.value] = set()
        elif isinstance(deps, ast.Set | ast.List | ast.Tuple) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in deps.elts):
            layers[key.value] = {e.value for e in deps.elts}  # type: ignore[attr-defined]
        else:
            raise LayersUnreadable(f"{noxfile}:{deps.lineno}: {name}[{key.value!r}] must be a set of library name "
                                   f"strings, like {{'dsconfig'}} or set()")
    return layers


def source_dirs(root: Path, layers: dict[str, set[str]]) -> list[tuple[str, Path]]:
    dirs = [(lib, root / "facade" / "src" if lib == FACADE else root / "libs" / lib / "src") for lib in layers]
    return [(lib, path) for lib, path in dirs if path.is_dir()]


def bench_dirs(root: Path, layers: dict[str, set[str]]) -> list[tuple[str, Path]]:
    dirs = [(lib, root / "facade" / "bench" if lib == FACADE else root / "libs" / lib / "bench") for lib in layers]
    return [(lib, path) for lib, path in dirs if path.is_dir()]


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `tree`, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
                found.append((node.lineno, first.value.split(".")[0]))
    return found


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _rule(lib: str, allowed: set[str], source: str = "noxfile.py LAYERS") -> str:
    return f"{lib} may import only {', '.join(sorted(allowed)) or 'no other library'} ({source})"


def check(root: Path) -> list[str]:
    """Every violation, one line each (empty when the layering holds)."""
    layers = read_layers(root / "noxfile.py")
    problems: list[str] = []
    listed: list[str] = []
    for lib, deps in layers.items():
        problems += [f"noxfile.py LAYERS: {lib} depends on {dep}, which is not a library listed above it"
                     for dep in sorted(deps) if dep not in listed]
        listed.append(lib)
    libs_dir = root / "libs"
    if libs_dir.is_dir():
        problems += [f"libs/{path.name}: a library without a line in noxfile.py LAYERS; add one"
                     for path in sorted(libs_dir.iterdir())
                     if (path / "src" / path.name).is_dir() and path.name not in layers]
    bench_layers = read_layers(root / "noxfile.py", "BENCH_LAYERS", required=False)
    for lib, deps in bench_layers.items():
        problems += [f"noxfile.py BENCH_LAYERS: {lib}'s benchmarks may import {dep}, which is not a library in "
                     f"LAYERS" for dep in sorted(deps) if dep not in layers]
        if lib not in layers:
            problems.append(f"noxfile.py BENCH_LAYERS: {lib} is not a library in LAYERS")
    for lib, src in source_dirs(root, layers):
        problems += _check_dir(root, src, lib, layers, layers[lib], None)
    for lib, bench in bench_dirs(root, layers):
        extra = bench_layers.get(lib, set())
        problems += _check_dir(root, bench, lib, layers, layers[lib] | extra, extra)
    return problems


def _check_dir(root: Path, folder: Path, lib: str, layers: dict[str, set[str]], allowed: set[str],
               bench_extra: set[str] | None) -> list[str]:
    """Imports under `folder` (lib's src/, or with `bench_extra` its bench/) of libraries outside `allowed`."""
    problems = []
    for py in sorted(folder.rglob("*.py")):
        where = py.relative_to(root)
        try:
            tree = ast.parse(py.read_text(), str(py))
        except (SyntaxError, UnicodeDecodeError) as exc:
            problems.append(f"{where}: does not parse, so its imports cannot be checked: {exc}")
            continue
        for line, name in imported_names(tree):
            if name not in layers or name == lib or name in allowed:
                continue
            if bench_extra is not None:
                why = (f"{_rule('its bench/', allowed, 'noxfile.py LAYERS and BENCH_LAYERS')}; a benchmark that "
                       f"times what users run through {name} is listed in BENCH_LAYERS[{lib!r}]")
                problems.append(f"{where}:{line}: {lib}'s benchmark imports {name}; {why}")
                continue
            why = "nothing imports dstrain, the facade" if name == FACADE else _rule(lib, allowed)
            problems.append(f"{where}:{line}: {lib} imports {name}; {why}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = Path(argv[1] if len(argv) == 2 else Path(__file__).resolve().parent.parent).resolve()
    try:
        problems = check(root)
    except LayersUnreadable as exc:
        print(f"check_layers: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_layers: {len(problems)} layering violation(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
