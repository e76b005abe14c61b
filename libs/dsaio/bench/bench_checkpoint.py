"""Durable save into a new file and cold load of a 1 GiB state dict: dsaio against torch.save + fsync /
torch.load (and safetensors for reference), plus a raw sync_pread of the same bytes. Interleaved: each
round runs every saver and every loader once, in an order that rotates from round to round.

  save   into a path that does not exist (the previous round's file is removed and the removal synced
         outside the timing): a checkpoint is a new file. dsaio.save_state_dict writes a temp file,
         fsyncs it, renames it into place and fsyncs the directory; torch.save and safetensors are
         followed by an fsync of the file.
  load   page cache dropped first (echo 3 > /proc/sys/vm/drop_caches; the script says when that is
         refused), so every loader reads from the disk.

    flock /tmp/dstrain-bench.lock python libs/dsaio/bench/bench_checkpoint.py --dir /tmp/dsaio-bench --pairs 5
    flock /tmp/dstrain-bench.lock python libs/dsaio/bench/bench_checkpoint.py --dir /dev/shm/dsaio-bench --pairs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import safetensors.torch as st
import torch

import dsaio
from dsaio.cli._measure import drop_page_cache


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
        os.sync()  # freeing the old file's blocks is not left to land inside the next timing


def rotate(items: list, by: int) -> list:
    by %= len(items)
    return items[by:] + items[:by]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/dsaio-bench")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--pairs", type=int, default=5, help="rounds (each holds one run of every saver and loader)")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    n = int(args.gib * (1 << 30)) // 4 // 16
    torch.manual_seed(0)
    # An optimizer-like state: 16 fp32 tensors of 64 MiB plus scalars.
    state = {"step": 100, "params": {f"p{i}": torch.randn(n) for i in range(16)}}
    flat = state["params"]
    nbytes = sum(t.numel() * t.element_size() for t in flat.values())
    paths = {k: os.path.join(args.dir, f"ckpt.{k}") for k in ("dsaio", "torch", "st")}
    cold = drop_page_cache()
    print(f"dsaio {dsaio.__version__}, torch {torch.__version__}, {nbytes / (1 << 30):.2f} GiB in {args.dir}; "
          f"page cache {'dropped before each load' if cold else 'NOT dropped (not root): loads may be warm'}")

    def save_torch():
        torch.save(state, paths["torch"])
        fsync_path(paths["torch"])

    def save_st():
        st.save_file(flat, paths["st"])
        fsync_path(paths["st"])

    savers = {"dsaio.save_state_dict": (paths["dsaio"], lambda: dsaio.save_state_dict(state, paths["dsaio"])),
              "torch.save+fsync": (paths["torch"], save_torch),
              "safetensors.save_file+fsync": (paths["st"], save_st)}
    raw_buf = np.empty(nbytes, np.uint8)
    h = dsaio.aio_handle()
    loaders = {"dsaio.load_state_dict": lambda: dsaio.load_state_dict(paths["dsaio"]),
               "torch.load": lambda: torch.load(paths["torch"]),
               "safetensors.load_file": lambda: st.load_file(paths["st"]),
               "raw sync_pread": lambda: h.sync_pread(raw_buf, paths["dsaio"], os.path.getsize(paths["dsaio"]) - nbytes)}
    times: dict[str, list[float]] = {}
    for i in range(args.pairs):
        for name, (path, fn) in rotate(list(savers.items()), i):
            remove(path)
            start = time.perf_counter()
            fn()
            times.setdefault(name, []).append(time.perf_counter() - start)
        for name, fn in rotate(list(loaders.items()), i):
            drop_page_cache()
            start = time.perf_counter()
            fn()
            times.setdefault(name, []).append(time.perf_counter() - start)
        print(f"  round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    ratios = {"save vs torch.save+fsync": ("torch.save+fsync", "dsaio.save_state_dict"),
              "save vs safetensors+fsync": ("safetensors.save_file+fsync", "dsaio.save_state_dict"),
              "load vs torch.load": ("torch.load", "dsaio.load_state_dict"),
              "load vs safetensors": ("safetensors.load_file", "dsaio.load_state_dict")}
    print(f"\nmedians of {args.pairs} rounds, {nbytes / (1 << 30):.2f} GiB of tensors:")
    for k, v in times.items():
        med = statistics.median(v)
        print(f"  {k:28} {med:.3f} s  ({nbytes / med / 1e9:.2f} GB/s)   (runs: {', '.join(f'{x:.2f}' for x in v)})")
    for label, (theirs, mine) in ratios.items():
        per_round = [t / m for t, m in zip(times[theirs], times[mine])]
        print(f"  dsaio {label:26} {statistics.median(per_round):.2f}x faster (median of per-round ratios; "
              f"runs: {', '.join(f'{x:.2f}' for x in per_round)})")
    load_over_raw = [a / b for a, b in zip(times["dsaio.load_state_dict"], times["raw sync_pread"])]
    print(f"  load time / raw sync_pread time:   {statistics.median(load_over_raw):.2f}")
    for f in paths.values():
        if os.path.exists(f):
            os.unlink(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
