"""Durable save and cold load of a 1 GiB state dict: dsaio against torch.save + fsync /
torch.load and safetensors, plus a raw sync_pread of the same bytes; interleaved, page cache
dropped before each load (needs root for /proc/sys/vm/drop_caches).

    flock /tmp/dstrain-bench.lock python libs/dsaio/bench/bench_checkpoint.py --dir /tmp/dsaio-bench --pairs 5
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


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/dsaio-bench")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--pairs", type=int, default=5)
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    n = int(args.gib * (1 << 30)) // 4 // 16
    torch.manual_seed(0)
    # An optimizer-like state: 16 fp32 tensors of 64 MiB plus scalars.
    state = {"step": 100, "params": {f"p{i}": torch.randn(n) for i in range(16)}}
    flat = state["params"]
    nbytes = sum(t.numel() * t.element_size() for t in flat.values())
    paths = {k: os.path.join(args.dir, f"ckpt.{k}") for k in ("dsaio", "torch", "st")}
    if not drop_page_cache():
        print("warning: cannot drop the page cache (not root): loads are not cold", file=sys.stderr)

    def save_torch():
        torch.save(state, paths["torch"])
        fsync_path(paths["torch"])

    def save_st():
        st.save_file(flat, paths["st"])
        fsync_path(paths["st"])

    savers = {"dsaio.save_state_dict": lambda: dsaio.save_state_dict(state, paths["dsaio"]),
              "torch.save+fsync": save_torch, "safetensors.save_file+fsync": save_st}
    raw_buf = np.empty(nbytes, np.uint8)
    h = dsaio.aio_handle()
    loaders = {"dsaio.load_state_dict": lambda: dsaio.load_state_dict(paths["dsaio"]),
               "torch.load": lambda: torch.load(paths["torch"]),
               "safetensors.load_file": lambda: st.load_file(paths["st"]),
               "raw sync_pread": lambda: h.sync_pread(raw_buf, paths["dsaio"], os.path.getsize(paths["dsaio"]) - nbytes)}
    times: dict[str, list[float]] = {}
    for i in range(args.pairs):
        for name, fn in savers.items():
            times.setdefault(name, []).append(timed(fn))
        for name, fn in loaders.items():
            drop_page_cache()
            times.setdefault(name, []).append(timed(fn))
        print(f"  round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedians of {args.pairs} rounds, {nbytes / (1 << 30):.2f} GiB of tensors:")
    for k, v in med.items():
        print(f"  {k:28} {v:.3f} s  ({nbytes / v / 1e9:.2f} GB/s)")
    print(f"  save speed-up vs torch.save+fsync:   {med['torch.save+fsync'] / med['dsaio.save_state_dict']:.2f}x")
    print(f"  save speed-up vs safetensors+fsync:  {med['safetensors.save_file+fsync'] / med['dsaio.save_state_dict']:.2f}x")
    print(f"  load speed-up vs torch.load:         {med['torch.load'] / med['dsaio.load_state_dict']:.2f}x")
    print(f"  load speed-up vs safetensors:        {med['safetensors.load_file'] / med['dsaio.load_state_dict']:.2f}x")
    print(f"  load time / raw sync_pread time:     {med['dsaio.load_state_dict'] / med['raw sync_pread']:.2f}")
    for f in paths.values():
        os.unlink(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
