"""1 GiB sequential O_DIRECT write and read: dsaio's sync_pwrite / sync_pread against fio with the
same block size, queue depth and parallelism (ioengine libaio and io_uring), interleaved
(ours, fio, ours, fio, ...) because a virtual disk's speed swings from minute to minute.

    apt-get install -y fio      # the script says so when fio is missing
    flock /tmp/dstrain-bench.lock python libs/dsaio/bench/bench_io.py --dir /tmp/dsaio-bench --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

import dsaio


def fio(path: str, op: str, size: int, bs: int, qd: int, engine: str) -> float:
    cmd = ["fio", "--name=dsaio", f"--filename={path}", f"--rw={op}", f"--bs={bs}", f"--iodepth={qd}",
           f"--size={size}", "--direct=1", f"--ioengine={engine}", "--numjobs=1", "--output-format=json"]
    if op == "write":
        cmd.append("--end_fsync=1")
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    job = out["jobs"][0][op]
    return job["io_bytes"] / (job["runtime"] / 1000) / 1e9 if job["runtime"] else float("nan")


def ours(h: dsaio.aio_handle, buf: np.ndarray, path: str, op: str) -> float:
    start = time.perf_counter()
    if op == "write":
        h.sync_pwrite(buf, path)
        fd = os.open(path, os.O_RDONLY)
        os.fdatasync(fd)  # what fio's end_fsync does
        os.close(fd)
    else:
        h.sync_pread(buf, path)
    return buf.nbytes / (time.perf_counter() - start) / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/dsaio-bench")
    p.add_argument("--size", type=int, default=1 << 30)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--block_size", type=int, default=1 << 20)
    p.add_argument("--queue_depth", type=int, default=8)
    args = p.parse_args()
    if shutil.which("fio") is None:
        print("fio is missing: apt-get install -y fio", file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    buf = np.full(args.size + 4096, 7, np.uint8)
    buf = buf[(-buf.ctypes.data) % 4096 :][: args.size]
    ours_path, fio_path = os.path.join(args.dir, "ours.dat"), os.path.join(args.dir, "fio.dat")
    print(f"dsaio {dsaio.__version__}, engines: {[n for n, i in dsaio.backends().items() if i['available']]}")
    results: dict[str, list[float]] = {}
    for engine, fio_engine in (("aio", "libaio"), ("io_uring", "io_uring")):
        h = dsaio.aio_handle(block_size=args.block_size, queue_depth=args.queue_depth, engine=engine)
        h.sync_pwrite(buf, ours_path)  # both sides overwrite a laid-out file, as fio does
        for op in ("write", "read"):
            for i in range(args.pairs):
                a = ours(h, buf, ours_path, op)
                b = fio(fio_path, op, args.size, args.block_size, args.queue_depth, fio_engine)
                results.setdefault(f"{op} dsaio[{engine}]", []).append(a)
                results.setdefault(f"{op} fio[{fio_engine}]", []).append(b)
                results.setdefault(f"{op} ratio {engine}", []).append(a / b)
                print(f"  {op} pair {i + 1}: dsaio[{engine}] {a:.3f} GB/s, fio[{fio_engine}] {b:.3f} GB/s, "
                      f"ratio {a / b:.2f}", flush=True)
        h.close()
    print(f"\nmedians of {args.pairs} interleaved pairs, {args.size >> 20} MiB, bs {args.block_size >> 10} KiB, "
          f"qd {args.queue_depth}, parallelism 1:")
    for key, xs in results.items():
        unit = "x" if "ratio" in key else " GB/s"
        print(f"  {key:28} {statistics.median(xs):.3f}{unit}")
    for f in (ours_path, fio_path):
        os.unlink(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
