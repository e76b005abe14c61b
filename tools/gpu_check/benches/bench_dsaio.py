"""dsaio's aio_handle writing and reading a pinned host tensor of 1 GiB on this machine's disk (O_DIRECT where the
file system has it), against fio doing the same in the same run (libaio, 1 MiB blocks, queue depth 8, one job,
direct), in alternating pairs. Writes overwrite an existing file and end with fdatasync (fio: end_fsync);
reads start from a dropped page cache where this user may drop it. Target: >= 0.9x fio's rate.

    python tools/gpu_check/benches/bench_dsaio.py --dir /path/on/the/disk
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure, median, parse, skipped, write

import dsaio
from dsaio.cli._measure import drop_page_cache

BLOCK, DEPTH = 1 << 20, 8
FIO_NOTE = ("fio is not installed here: apt-get install fio, or carry its .deb and put its folder on PATH "
            "(tools/gpu_check/README.md)")


def fio_seconds(path: Path, op: str, nbytes: int) -> float:
    """fio's own seconds for writing (with its end fsync) or reading `nbytes` of `path`."""
    cmd = ["fio", "--name=gpu-check", f"--filename={path}", f"--rw={op}", f"--bs={BLOCK}", f"--iodepth={DEPTH}",
           f"--size={nbytes}", "--direct=1", "--ioengine=libaio", "--numjobs=1", "--output-format=json"]
    if op == "write":
        cmd.append("--end_fsync=1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"fio failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    job = json.loads(done.stdout)["jobs"][0][op]
    return job["runtime"] / 1000 if job["runtime"] else nbytes / max(job["bw_bytes"], 1)


def ours_seconds(handle: dsaio.aio_handle, buffer: torch.Tensor, path: Path, op: str) -> float:
    started = time.perf_counter()
    if op == "read":
        handle.sync_pread(buffer, str(path))
    else:
        handle.sync_pwrite(buffer, str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # what fio's end_fsync does
        finally:
            os.close(fd)
    return time.perf_counter() - started


def main() -> None:
    args = parse(__doc__, lambda p: p.add_argument("--dir", type=Path, default=Path("gpu-check-io"),
                                                   help="a folder on the disk to measure (its files are removed)"))
    nbytes, pairs = (16 << 20, 1) if args.smoke else (1 << 30, 3)
    args.dir.mkdir(parents=True, exist_ok=True)
    ours_file, fio_file = args.dir / "dsaio.bin", args.dir / "fio.bin"
    pinned = torch.cuda.is_available()
    with dsaio.aio_handle(block_size=BLOCK, queue_depth=DEPTH) as handle:
        buffer = handle.new_cpu_locked_tensor(nbytes, torch.empty(0, dtype=torch.uint8))
        buffer.random_(0, 256)
        has_fio = shutil.which("fio") is not None
        results = {(side, op): [] for side in ("ours", "fio") for op in ("write", "read")}
        dropped = True
        try:
            handle.sync_pwrite(buffer, str(ours_file))  # the files exist before the first timed write
            if has_fio:
                fio_seconds(fio_file, "write", nbytes)
            for pair in range(pairs):
                for op in ("write", "read"):
                    sides = ("ours", "fio") if pair % 2 == 0 else ("fio", "ours")
                    for side in sides:
                        if side == "fio" and not has_fio:
                            continue
                        if op == "read" and not args.smoke:  # a smoke run measures nothing: no machine-wide sync
                            dropped = drop_page_cache() and dropped
                        seconds = (ours_seconds(handle, buffer, ours_file, op) if side == "ours"
                                   else fio_seconds(fio_file, op, nbytes))
                        results[side, op].append(nbytes / seconds / 1e9)
            engine = handle.get_engine()
        finally:
            ours_file.unlink(missing_ok=True)
            fio_file.unlink(missing_ok=True)
        handle.free_cpu_locked_tensor(buffer)
    figures = []
    for op in ("write", "read"):
        what = "cold cache" if op == "read" else "overwrite + fdatasync"
        name = f"dsaio {op} of a {'pinned' if pinned else 'page-locked'} tensor ({what})"
        anchor = f"fio libaio bs {BLOCK >> 20} MiB iodepth {DEPTH} direct"
        if not has_fio:
            figures.append(skipped(name, FIO_NOTE, "GB/s", anchor, ">= 0.9"))
            continue
        figures.append(figure(name, median(results["ours", op]), "GB/s", anchor, median(results["fio", op]),
                              ">= 0.9", pairs, bytes=nbytes, engine=engine, directory=str(args.dir),
                              page_cache_dropped=dropped,
                              pinned=pinned, rates_GBps={s: [round(r, 3) for r in results[s, op]] for s in ("ours", "fio")}))
    write(args, figures)


if __name__ == "__main__":
    main()
