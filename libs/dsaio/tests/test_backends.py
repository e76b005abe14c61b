"""Which engines work, the default choice, and the pure-Python fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import dsaio
from dsaio.engines import PREFERENCE


def test_backends_report_every_engine_with_a_reason():
    found = dsaio.backends()
    assert list(found) == list(PREFERENCE)
    for info in found.values():
        assert isinstance(info["available"], bool) and info["reason"]
    assert found["python"]["available"]


def test_engines_are_probed_once_per_process():
    """A probe sets up a kernel queue; paying it on every handle, save and load cost tens of ms each."""
    import time

    dsaio.backends()
    start = time.perf_counter()
    for _ in range(100):
        dsaio.backends()
        dsaio.aio_handle()
    assert time.perf_counter() - start < 0.5  # about 3 s when every call probed again


def test_native_engines_built_here():
    # The package is installed with a compiler and kernel headers here, so the core must exist.
    found = dsaio.backends()
    assert found["threads"]["available"], found["threads"]["reason"]


def test_default_is_the_first_that_works(monkeypatch):
    monkeypatch.delenv("DSAIO_ENGINE", raising=False)
    first = next(n for n, i in dsaio.backends().items() if i["available"])
    assert dsaio.aio_handle().get_engine() == first
    monkeypatch.setenv("DSAIO_ENGINE", "python")
    assert dsaio.aio_handle().get_engine() == "python"


def test_pure_python_fallback_warns_once_and_works(tmp_path):
    code = textwrap.dedent(f"""
        import warnings, numpy as np
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import dsaio
            info = dsaio.backends()
            h1 = dsaio.aio_handle(); h2 = dsaio.aio_handle(intra_op_parallelism=2)
        src = np.arange(100_003, dtype=np.uint8)
        h2.sync_pwrite(src, {str(tmp_path / "f.bin")!r}, 5)
        dst = np.empty_like(src); h1.sync_pread(dst, {str(tmp_path / "f.bin")!r}, 5)
        assert np.array_equal(src, dst)
        print(h1.get_engine(), info["aio"]["available"], len([w for w in caught if "pure-Python" in str(w.message)]))
        print(info["aio"]["reason"])
    """)
    env = dict(os.environ, DSAIO_NO_NATIVE="1")
    env.pop("DSAIO_ENGINE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    first, reason = out.stdout.splitlines()
    assert first.split() == ["python", "False", "1"]
    assert "DSAIO_NO_NATIVE" in reason


def test_import_does_not_import_torch():
    code = "import sys, dsaio; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_unavailable_engine_is_a_clear_error(monkeypatch):
    import dsaio.engines as engines

    monkeypatch.setattr(engines, "backends", lambda: {"aio": {"available": False, "reason": "io_setup failed: EPERM"},
                                                      "python": {"available": True, "reason": ""}})
    monkeypatch.setattr(engines, "_engines", {})
    with pytest.raises(RuntimeError, match="io_setup failed"):
        engines.get_engine("aio")
