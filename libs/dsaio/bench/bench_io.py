"""What users do with aio_handle, against fio doing the same, interleaved (a virtual disk's speed swings
from minute to minute, so each of our runs is paired with a fio run next to it, in alternating order):

  new        sync_pwrite into a file that does not exist yet, then fdatasync, timed from the open
             (which includes reserving the file's blocks); fio --rw=write --end_fsync=1 into a file it
             creates and lays out itself (fallocate=native, its default) before its clock starts. This
             is a checkpoint or swap file written the first time. The layout is timed too (fio
             --create_only=1, less fio's start-up) and shown as "fio incl. layout".
  overwrite  the same into the file the previous run left; fio the same into its previous file.
  read       page cache dropped first (echo 3 > /proc/sys/vm/drop_caches; when that is refused the
             script says so and the reads may be warm), then sync_pread of the whole file; fio --rw=read.

Same block size, queue depth and one thread on both sides, O_DIRECT where the file system has it (the
first line says what the engine does there), random bytes. fio's figure is its own io_bytes / runtime;
ours is the wall time of the call plus fdatasync. Our buffer is the whole file (`--buffer` makes it a
few MiB mapped again and again, as fio reuses bs x iodepth bytes) on 4 KiB pages (`--pages`).

    apt-get install -y fio      # the script says so when fio is missing
    flock /tmp/dstrain-bench.lock python libs/dsaio/bench/bench_io.py --dir /tmp/dsaio-bench --pairs 5
    flock /tmp/dstrain-bench.lock python libs/dsaio/bench/bench_io.py --dir /dev/shm/dsaio-bench --pairs 5
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

import dsaio
from dsaio._files import open_file
from dsaio.cli._measure import drop_page_cache

FIO_OP = {"new": "write", "overwrite": "write", "read": "read"}


def fio_command(path: str, op: str, size: int, bs: int, qd: int, engine: str, direct: bool) -> list[str]:
    cmd = ["fio", "--name=dsaio", f"--filename={path}", f"--rw={op}", f"--bs={bs}", f"--iodepth={qd}",
           f"--size={size}", f"--direct={int(direct)}", f"--ioengine={engine}", "--numjobs=1",
           "--output-format=json"]
    return [*cmd, "--end_fsync=1"] if op == "write" else cmd


def fio_layout(cmd: list[str]) -> float:
    """Wall seconds of fio laying out its file and exiting (--create_only=1)."""
    start = time.perf_counter()
    subprocess.run([*cmd, "--create_only=1"], capture_output=True, check=True)
    return time.perf_counter() - start


def fio(cmd: list[str], op: str) -> float:
    """fio's own seconds for the job (its start-up and layout excluded)."""
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return out["jobs"][0][op]["runtime"] / 1000


def ours(h: dsaio.aio_handle, buf: np.ndarray, path: str, case: str) -> float:
    """Seconds for the whole file in one call, as a tensor is written or read."""
    start = time.perf_counter()
    if case == "read":
        h.sync_pread(buf, path)
    else:
        h.sync_pwrite(buf, path)
        fd = os.open(path, os.O_RDONLY)
        os.fdatasync(fd)  # what fio's end_fsync does
        os.close(fd)
    return time.perf_counter() - start


def page_backed(nbytes: int, pages: str, physical: int | None = None) -> np.ndarray:
    """A page-aligned buffer of `nbytes` on 4 KiB pages (as fio's buffers and torch's CPU tensors are)
    or on transparent huge pages (as numpy gives large arrays). It matters: with 4 KiB pages a 1 MiB
    direct request needs 256 segments, more than this disk's queue takes (254), so the kernel splits
    it in two; a huge page makes it one segment.

    With `physical`, the buffer is that many bytes of memory mapped again and again to span `nbytes`:
    one request over all of it reads the same few hot pages over and over, as fio's bs x iodepth
    buffer is reused (a hypervisor copying guest memory, or a tmpfs copy, runs faster from a buffer
    that stays in the CPU's cache than from a gigabyte that does not)."""
    if physical is None:
        mapping = mmap.mmap(-1, nbytes)
        mapping.madvise(mmap.MADV_HUGEPAGE if pages == "huge" else mmap.MADV_NOHUGEPAGE)
        return np.frombuffer(mapping, dtype=np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.memfd_create("dsaio-bench")
    os.ftruncate(fd, physical)
    base = libc.mmap(None, nbytes, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # PROT_NONE: address space only
    for offset in range(0, nbytes, physical):
        libc.mmap(base + offset, min(physical, nbytes - offset), mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_SHARED | 0x10, fd, 0)  # MAP_FIXED: over the reserved range
    os.close(fd)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(base))


def prepare(case: str, path: str) -> None:
    """Outside the timing: a new file must not exist; a read starts from a cold cache."""
    if case == "new" and os.path.exists(path):
        os.unlink(path)
        os.sync()  # the freed blocks' journal commit is not left to land inside the next timing
    if case == "read":
        drop_page_cache()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/dsaio-bench")
    p.add_argument("--size", type=int, default=1 << 30)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--block_size", type=int, default=1 << 20)
    p.add_argument("--queue_depth", type=int, default=8)
    p.add_argument("--engines", default="aio,io_uring", help="of aio, io_uring (fio: libaio, io_uring)")
    p.add_argument("--pages", choices=["4k", "huge"], default="4k", help="what backs our buffer (fio: 4k)")
    p.add_argument("--buffer", type=int, default=None,
                   help="bytes of memory behind our buffer, mapped again and again (default: the whole --size)")
    args = p.parse_args()
    if shutil.which("fio") is None:
        print("fio is missing: apt-get install -y fio", file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    buf = page_backed(args.size, args.pages, args.buffer)
    fill = args.buffer or args.size  # (the rest of an aliased buffer is the same memory)
    buf[:fill] = np.random.default_rng(0).integers(0, 256, fill, dtype=np.uint8)  # incompressible, as fio's
    ours_path, fio_path = os.path.join(args.dir, "ours.dat"), os.path.join(args.dir, "fio.dat")
    probe = dsaio.aio_handle()
    probe.sync_pwrite(buf[:4096], ours_path)
    direct = open_file(ours_path, True, "probe")  # what the engine does on this file system
    has_direct = direct.align.direct
    direct.close()
    cold = drop_page_cache()
    print(f"dsaio {dsaio.__version__}, {args.size >> 20} MiB, bs {args.block_size >> 10} KiB, qd "
          f"{args.queue_depth}, one thread, our buffer {(args.buffer or args.size) >> 20} MiB on {args.pages} pages; {args.dir}: "
          f"{'O_DIRECT (' + str(dsaio.aio_handle().get_alignment(args.dir)) + '-byte alignment)' if has_direct else 'no O_DIRECT: buffered I/O on both sides'}; "
          f"page cache {'dropped before each read' if cold else 'NOT dropped (not root): reads may be warm'}")
    results: dict[str, list[float]] = {}
    gb = args.size / 1e9
    for engine in args.engines.split(","):
        fio_engine = {"aio": "libaio", "io_uring": "io_uring"}[engine]
        h = dsaio.aio_handle(block_size=args.block_size, queue_depth=args.queue_depth, engine=engine)
        commands = {op: fio_command(fio_path, op, args.size, args.block_size, args.queue_depth, fio_engine,
                                    has_direct) for op in ("write", "read")}
        for case in ("new", "overwrite", "read"):
            op = FIO_OP[case]
            if case == "new":  # fio's start-up, to take out of its timed layout
                fio(commands[op], op)
                startup = statistics.median(fio_layout(commands[op]) for _ in range(3))
            for i in range(args.pairs):
                runs = {}
                for side in (("ours", "fio") if i % 2 == 0 else ("fio", "ours")):
                    path = ours_path if side == "ours" else fio_path
                    prepare(case, path)
                    if side == "ours":
                        runs["ours"] = ours(h, buf, path, case)
                    else:
                        layout = max(fio_layout(commands[op]) - startup, 0.0) if case == "new" else 0.0
                        runs["fio"], runs["layout"] = fio(commands[op], op), layout
                a, b = gb / runs["ours"], gb / runs["fio"]
                results.setdefault(f"{case} dsaio[{engine}]", []).append(a)
                results.setdefault(f"{case} fio[{fio_engine}]", []).append(b)
                results.setdefault(f"{case} ratio {engine}", []).append(a / b)
                extra = ""
                if case == "new":
                    c = gb / (runs["fio"] + runs["layout"])
                    results.setdefault(f"{case} fio[{fio_engine}] incl. layout", []).append(c)
                    results.setdefault(f"{case} ratio {engine} vs fio incl. layout", []).append(a / c)
                    extra = f" (incl. its layout {c:.3f} GB/s, ratio {a / c:.2f})"
                print(f"  {case:9} pair {i + 1}: dsaio[{engine}] {a:.3f} GB/s, fio[{fio_engine}] {b:.3f} GB/s, "
                      f"ratio {a / b:.2f}{extra}", flush=True)
        h.close()
    print(f"\nmedians of {args.pairs} interleaved pairs:")
    for key, xs in results.items():
        unit = "x" if "ratio" in key else " GB/s"
        print(f"  {key:44} {statistics.median(xs):.3f}{unit}   (runs: {', '.join(f'{x:.2f}' for x in xs)})")
    for f in (ours_path, fio_path):
        if os.path.exists(f):
            os.unlink(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
