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
