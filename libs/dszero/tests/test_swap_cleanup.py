"""NVMe swap directories of killed runs are removed when the next swap file is made on the same path,
with the bytes freed logged; a live process's directory, another host's, or an unmarked one is kept."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dszero.offload.swap import SwapFile
from dszero.offload.swap_owners import MARKER, identity

KEY = "zero_optimization.offload_optimizer"

# A run that makes a swap file, writes 2 MiB into it and waits to be killed.
_RUN = textwrap.dedent("""
    import sys, time, torch
    from pathlib import Path
    from dszero.offload.swap import SwapFile
    swap = SwapFile(Path(sys.argv[1]), sys.argv[2], 0, None, "key")
    swap.write(torch.ones(1 << 19), swap.allocate(2 << 20))
    print(swap.directory, flush=True)
    time.sleep(600)
""")


def _start(nvme: Path, purpose: str) -> tuple[subprocess.Popen, Path]:
    child = subprocess.Popen([sys.executable, "-c", _RUN, str(nvme), purpose], stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline().strip()
    assert line, "the child did not make its swap file"
    return child, Path(line)


def _kill(child: subprocess.Popen, reap: bool = True) -> None:
    child.send_signal(signal.SIGKILL)
    if reap:
        child.wait(timeout=60)
    else:  # wait until it has died, but leave it unreaped (WNOWAIT)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)


def _marked(nvme: Path, name: str, **owner) -> Path:
    directory = nvme / name
    directory.mkdir()
    (directory / MARKER).write_text(json.dumps({**identity(), **owner}))
    (directory / "optimizer.swp").write_bytes(b"x" * 8192)
    return directory


def test_swap_dir_is_marked_with_its_owner(tmp_path):
    swap = SwapFile(tmp_path, "optimizer", 3, None, KEY)
    try:
        owner = json.loads((swap.directory / MARKER).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] and owner["start_time"] is not None
        assert swap.directory.name.startswith("dszero_optimizer_rank3_")
    finally:
        swap.close()
    assert not swap.directory.exists()


def test_dirs_of_killed_runs_are_removed_at_start(tmp_path, caplog):
    killed, killed_dir = _start(tmp_path, "optimizer")
    zombie, zombie_dir = _start(tmp_path, "params")
    alive, alive_dir = _start(tmp_path, "optimizer")
    try:
        _kill(killed)
        _kill(zombie, reap=False)  # killed, not yet waited for: a zombie holding its pid
        other_host = _marked(tmp_path, "dszero_optimizer_rank1_otherhost", host="another-host", pid=killed.pid)
        reused = _marked(tmp_path, "dszero_params_rank2_reusedpid", start_time=-1)  # our pid, not us
        unmarked = tmp_path / "dszero_optimizer_rank4_unmarked"
        unmarked.mkdir()
        unrelated = _marked(tmp_path, "not_a_swap_dir", pid=killed.pid)
        assert killed_dir.exists() and zombie_dir.exists()
        with caplog.at_level(logging.WARNING, logger="dszero"):
            swap = SwapFile(tmp_path, "optimizer", 0, None, KEY)
        try:
            assert not killed_dir.exists() and not zombie_dir.exists() and not reused.exists()
            assert alive_dir.exists() and other_host.exists() and unmarked.exists() and unrelated.exists()
            assert swap.directory.exists()
            logged = "\n".join(r.getMessage() for r in caplog.records)
            for gone in (killed_dir, zombie_dir):
                assert str(gone) in logged, logged
            assert "MB freed" in logged and "2.1 MB freed" in logged, logged  # the 2 MiB the run wrote
            assert not [p for p in tmp_path.iterdir() if ".removing-" in p.name]
        finally:
            swap.close()
        alive.send_signal(signal.SIGKILL)
        alive.wait(timeout=60)
        SwapFile(tmp_path, "params", 0, None, KEY).close()  # the next start cleans up after it too
        assert not alive_dir.exists()
    finally:
        for child in (killed, zombie, alive):
            if child.poll() is None:
                child.kill()
            child.wait(timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs in a private namespace (needs root)")
def test_swap_file_on_a_full_disk_fails_before_writing(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = textwrap.dedent(f"""
        import json, os, torch, dsaio
        from pathlib import Path
        from dszero.offload.swap import SwapFile
        swap = SwapFile(Path({str(mnt)!r}), "optimizer", 0, None, "key")
        free = os.statvfs({str(mnt)!r}).f_bfree
        try:
            swap.write(torch.ones(1 << 20), swap.allocate(4 << 20))
            out = {{"error": None}}
        except dsaio.AioError as e:
            out = {{"error": e.errno, "message": str(e)}}
        out["swap size"] = os.path.getsize(swap.path)
        out["blocks used"] = free - os.statvfs({str(mnt)!r}).f_bfree
        swap.close()
        out["left"] = os.listdir({str(mnt)!r})
        print(json.dumps(out))
    """)
    script = f"mount -t tmpfs -o size=1m tmpfs {mnt} && exec {sys.executable} -c \"$0\""
    run = subprocess.run(["unshare", "-m", "sh", "-c", script, code], capture_output=True, text=True, timeout=120)
    if run.returncode != 0 and "mount" in run.stderr:
        pytest.skip(f"cannot mount here: {run.stderr.strip()}")
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["error"] == 28 and "reserving" in out["message"], out  # ENOSPC, said before writing
    assert out["swap size"] == 0 and out["blocks used"] == 0, out
    assert out["left"] == [], out
