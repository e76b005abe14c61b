"""Writes that create or extend a file reserve its blocks first: a full disk fails before any byte is
written and leaves no partial file; where the file system refuses fallocate, the fallbacks work and
are logged once. Each test runs in a private mount namespace on a small file system of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                               reason="mounts a small file system in a private namespace (needs root)")


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _run_mounted(mount: str, mnt, code: str) -> dict:
    """Runs `code` with `mnt` mounted by the shell command `mount`; returns the JSON it prints last."""
    mnt.mkdir()
    script = f"{mount} && exec {sys.executable} -c {_quote(textwrap.dedent(code))}"
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and not out.stdout.strip():
        if "mount" in out.stderr or "loop" in out.stderr:
            pytest.skip(f"cannot mount here: {out.stderr.strip()}")
        raise AssertionError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


FULL_DISK = """
    import errno, json, os, numpy as np, dsaio
    mnt = {mnt!r}
    report = {{}}
    def attempt(name, fn):
        before = os.statvfs(mnt).f_bfree
        try:
            fn()
            report[name] = "written"
        except dsaio.AioError as e:
            report[name] = [e.errno, e.filename, e.operation, str(e)]
        report[name + " blocks used"] = before - os.statvfs(mnt).f_bfree
    h = dsaio.aio_handle()
    report["alignment"] = h.get_alignment(mnt)
    big = np.ones(4 << 20, np.uint8)
    attempt("sync_pwrite", lambda: h.sync_pwrite(big, mnt + "/new.bin"))
    attempt("pwrite", lambda: h.pwrite(big, mnt + "/new2.bin", validate=True))
    def async_write():
        h.async_pwrite(big, mnt + "/new3.bin")
        h.wait()
    attempt("async_pwrite", async_write)
    old = np.arange(65536, dtype=np.uint8)
    h.sync_pwrite(old, mnt + "/old.bin")
    attempt("extend", lambda: h.sync_pwrite(big, mnt + "/old.bin", 65536))
    report["old size"] = os.path.getsize(mnt + "/old.bin")
    back = np.empty(65536, np.uint8)
    h.sync_pread(back, mnt + "/old.bin")
    report["old intact"] = bool(np.array_equal(back, old))
    attempt("save", lambda: dsaio.save({{"x": big}}, mnt + "/c.safetensors"))
    report["files"] = sorted(os.listdir(mnt))
    # Nothing the failures left behind holds space: what fits still fits.
    attempt("fits", lambda: h.sync_pwrite(np.ones(512 << 10, np.uint8), mnt + "/fits.bin"))
    print(json.dumps(report))
"""


@ROOT_ONLY
def test_full_disk_fails_before_writing_and_leaves_no_partial_file(tmp_path):
    mnt = tmp_path / "mnt"
    r = _run_mounted(f"mount -t tmpfs -o size=1m tmpfs {mnt}", mnt, FULL_DISK.format(mnt=str(mnt)))
    for name, path in (("sync_pwrite", "new.bin"), ("pwrite", "new2.bin"), ("async_pwrite", "new3.bin"),
                       ("extend", "old.bin"), ("save", None)):
        assert r[name][0] == 28, (name, r[name])  # ENOSPC
        assert "reserving" in r[name][3], r[name]  # said while reserving, before any write
        if path:
            assert r[name][1] == str(mnt / path)
        assert r[name + " blocks used"] == 0, (name, r)
    assert r["sync_pwrite"][2] == "sync_pwrite" and r["async_pwrite"][2] == "async_pwrite"
    assert r["old size"] == 65536 and r["old intact"]
    assert r["files"] == ["old.bin"], r["files"]  # no partial new file, no checkpoint temp file
    assert r["fits"] == "written"
    assert r["alignment"] == 1  # tmpfs is written buffered: its O_DIRECT is the same copy, only aligned


FALLBACK = """
    import json, logging, os, numpy as np, dsaio
    mnt = {mnt!r}
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("dsaio").addHandler(Keep())
    logging.getLogger("dsaio").setLevel(logging.INFO)
    h = dsaio.aio_handle()
    data = np.random.default_rng(0).integers(0, 256, (1 << 20) + 5, dtype=np.uint8)
    for name in ("a.bin", "b.bin"):
        h.sync_pwrite(data, mnt + "/" + name)
    back = np.empty_like(data)
    h.sync_pread(back, mnt + "/b.bin")
    report = {{"same": bool(np.array_equal(back, data)), "size": os.path.getsize(mnt + "/b.bin"), "log": records}}
    try:
        h.sync_pwrite(np.ones(64 << 20, np.uint8), mnt + "/big.bin")
        report["big"] = "written"
    except dsaio.AioError as e:
        report["big"] = [e.errno, str(e)]
    report["files"] = sorted(os.listdir(mnt))
    print(json.dumps(report))
"""


@ROOT_ONLY
def test_ramfs_refuses_fallocate_posix_fallocate_serves(tmp_path):
    """ramfs has no fallocate and no O_DIRECT: glibc's posix_fallocate reserves block by block."""
    mnt = tmp_path / "mnt"
    r = _run_mounted(f"mount -t ramfs ramfs {mnt}", mnt, FALLBACK.format(mnt=str(mnt)))
    assert r["same"] and r["size"] == (1 << 20) + 5
    assert len([m for m in r["log"] if "posix_fallocate" in m]) == 1, r["log"]  # once, not per write
    assert r["big"] == "written"  # ramfs has no size limit


@ROOT_ONLY
def test_ext2_refuses_fallocate_ftruncate_serves_and_checks_space(tmp_path):
    """ext2 (no extents) refuses fallocate, and posix_fallocate cannot write a byte through O_DIRECT:
    the file is sized with ftruncate, after checking that the free space holds it."""
    if shutil.which("mkfs.ext2") is None:
        pytest.skip("mkfs.ext2 is missing")
    image, mnt = tmp_path / "ext2.img", tmp_path / "mnt"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext2", "-q", "-F", str(image)], check=True, capture_output=True, timeout=60)
    r = _run_mounted(f"mount -o loop {image} {mnt}", mnt, FALLBACK.format(mnt=str(mnt)))
    assert r["same"] and r["size"] == (1 << 20) + 5
    assert len([m for m in r["log"] if "ftruncate" in m]) == 1, r["log"]
    assert r["big"][0] == 28 and "reserving" in r["big"][1], r["big"]
    assert "big.bin" not in r["files"]
