"""tools/check_layers.py on small planted repositories, and on this one. Standard library and pytest only
(nox's lint session runs it)."""

import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "check_layers.py"
REPO = TOOL.parent.parent

NOXFILE = '''
import nox

LAYERS: dict[str, set[str]] = {
    "low": set(),
    "side": set(),
    "mid": {"low"},
    "dstrain": {"low", "side", "mid"},
}
'''


def run(root):
    done = subprocess.run([sys.executable, str(TOOL), str(root)], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def write(root, path, text):
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(textwrap.dedent(text))


def make_repo(root, noxfile=NOXFILE):
    write(root, "noxfile.py", noxfile)
    write(root, "libs/low/src/low/__init__.py", "import os\n")
    write(root, "libs/side/src/side/__init__.py", "from . import helpers\n")
    write(root, "libs/side/src/side/helpers.py", "")
    write(root, "libs/mid/src/mid/__init__.py", "import low.thing\nfrom low import x\n")
    write(root, "facade/src/dstrain/__init__.py", "import mid, side\nfrom low.deep import y\n")
    return root


def test_a_repository_that_follows_its_layers_passes(tmp_path):
    assert run(make_repo(tmp_path)) == (0, "", "")


def test_planted_imports_are_reported_with_file_line_and_rule(tmp_path):
    root = make_repo(tmp_path)
    write(root, "libs/low/src/low/bad.py", """\
        import os

        import mid.sub as m


        def later():
            from side import helpers
            import dstrain
            return __import__("mid"), helpers, dstrain
        """)
    write(root, "libs/mid/src/mid/lazy.py", """\
        import importlib


        def load():
            return importlib.import_module("side.helpers"), importlib.import_module(".x", "mid")
        """)
    code, out, err = run(root)
    assert code == 1, out
    assert out.splitlines() == [
        "libs/low/src/low/bad.py:3: low imports mid; low may import only no other library (noxfile.py LAYERS)",
        "libs/low/src/low/bad.py:7: low imports side; low may import only no other library (noxfile.py LAYERS)",
        "libs/low/src/low/bad.py:8: low imports dstrain; nothing imports dstrain, the facade",
        "libs/low/src/low/bad.py:9: low imports mid; low may import only no other library (noxfile.py LAYERS)",
        "libs/mid/src/mid/lazy.py:5: mid imports side; mid may import only low (noxfile.py LAYERS)",
    ]
    assert "5 layering violation(s)" in err


def test_libraries_on_the_same_line_may_not_import_each_other(tmp_path):
    root = make_repo(tmp_path)
    write(root, "libs/side/src/side/helpers.py", "def f():\n    import low\n    return low\n")
    assert run(root)[:2] == (1, "libs/side/src/side/helpers.py:2: side imports low; side may import only no "
                                "other library (noxfile.py LAYERS)\n")


def test_layers_themselves_are_checked(tmp_path):
    root = make_repo(tmp_path, NOXFILE.replace('"mid": {"low"}', '"mid": {"low", "dstrain"}'))
    write(root, "libs/extra/src/extra/__init__.py", "")
    code, out, _ = run(root)
    assert code == 1
    assert "noxfile.py LAYERS: mid depends on dstrain, which is not a library listed above it" in out
    assert "libs/extra: a library without a line in noxfile.py LAYERS; add one" in out


def test_unreadable_layers_and_sources_are_named(tmp_path):
    root = make_repo(tmp_path, NOXFILE.replace('"mid": {"low"}', '"mid": make_deps()'))
    code, _, err = run(root)
    assert code == 2 and "LAYERS['mid'] must be a set of library name strings" in err
    assert run(make_repo(tmp_path / "none", "LAYER = {}\n"))[0] == 2
    root = make_repo(tmp_path / "syntax")
    write(root, "libs/mid/src/mid/broken.py", "def (:\n")
    code, out, _ = run(root)
    assert code == 1 and "libs/mid/src/mid/broken.py: does not parse" in out


def test_this_repository_follows_its_layers():
    code, out, err = run(REPO)
    assert code == 0, out + err


def test_benchmarks_follow_their_library_line_plus_bench_layers(tmp_path):
    root = make_repo(tmp_path)
    write(root, "libs/mid/bench/bench_mid.py", "import low\nimport side\n\n\ndef run():\n    import dstrain\n")
    write(root, "facade/bench/bench_engine.py", "import dstrain\nimport mid\n")  # the facade's own: all allowed
    code, out, _ = run(root)
    assert code == 1, out
    assert out.splitlines() == [
        "libs/mid/bench/bench_mid.py:2: mid's benchmark imports side; its bench/ may import only low (noxfile.py "
        "LAYERS and BENCH_LAYERS); a benchmark that times what users run through side is listed in "
        "BENCH_LAYERS['mid']",
        "libs/mid/bench/bench_mid.py:6: mid's benchmark imports dstrain; its bench/ may import only low (noxfile.py "
        "LAYERS and BENCH_LAYERS); a benchmark that times what users run through dstrain is listed in "
        "BENCH_LAYERS['mid']",
    ]
    allowed = NOXFILE + 'BENCH_LAYERS: dict[str, set[str]] = {"mid": {"dstrain", "side"}}\n'
    write(root, "noxfile.py", allowed)
    assert run(root) == (0, "", "")
    write(root, "libs/mid/src/mid/leak.py", "import dstrain\n")  # BENCH_LAYERS never widens src/
    assert run(root)[1] == "libs/mid/src/mid/leak.py:1: mid imports dstrain; nothing imports dstrain, the facade\n"


def test_bench_layers_themselves_are_checked(tmp_path):
    root = make_repo(tmp_path, NOXFILE + 'BENCH_LAYERS = {"mid": {"dstrain", "nosuch"}, "ghost": set()}\n')
    code, out, _ = run(root)
    assert code == 1
    assert "noxfile.py BENCH_LAYERS: mid's benchmarks may import nosuch, which is not a library in LAYERS" in out
    assert "noxfile.py BENCH_LAYERS: ghost is not a library in LAYERS" in out
    root = make_repo(tmp_path / "bad", NOXFILE + 'BENCH_LAYERS = {"mid": ["dstrain", 3]}\n')
    code, _, err = run(root)
    assert code == 2 and "BENCH_LAYERS['mid'] must be a set of library name strings" in err


def test_this_repository_reads_its_benchmarks():
    """Benchmarks that time the engine import dstrain from a lower library; BENCH_LAYERS lists exactly those libraries."""
    import ast
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_layers", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    layers = tool.read_layers(REPO / "noxfile.py")
    through_facade = {lib for lib, bench in tool.bench_dirs(REPO, layers) if lib != "dstrain"
                      for py in bench.rglob("*.py")
                      if "dstrain" in {name for _, name in tool.imported_names(ast.parse(py.read_text()))}}
    assert "dszero" in through_facade
    assert set(tool.read_layers(REPO / "noxfile.py", "BENCH_LAYERS")) == through_facade
