"""Compiled ZeRO-3 (dscompile) against eager ZeRO-3, eager ZeRO-1 and torch DDP on the 27M GPT of the
dszero / facade benchmarks (vocab 8192, d 512, 6 layers, seq 128, micro-batch 4), fp32, 2 gloo ranks.

Every configuration runs in its own freshly forked pair of ranks, one round after another (ddp, zero1,
zero3, compiled zero3, ...). Steady-state step times are medians of the timed steps (the slower rank);
compile time is reported apart: the compiled run's first step (dynamo + AOT + inductor) and the step at
which the default schedule recompiles with prefetch and selective gather (step 5, the reference's
WARMUP). Memory per rank, two ways: the resident-set high-water mark over the timed steps (reset with
/proc/self/clear_refs before them), which for a compiled run also holds what compiling left in the
process; and the training peak: the bytes of every tensor alive when the timed steps start (model
states, kept parameters) plus the most malloc handed out above that during them (sampled every 0.5 ms),
which counts the same things for every configuration.

    flock /tmp/dstrain-bench.lock python libs/dscompile/bench/bench_deepcompile.py [--steps 6] [--rounds 3]
        [--kinds ddp,zero1,zero3,compiled_zero3[,compiled_zero3_nokeep]]   # nokeep: no selective gather
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dscompile
import dszero
from dscomm.testing import run_ranks
from dsconfig import CompileConfig, ZeroConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dszero" / "bench"))
from bench_stages import GPT, MICRO, SEQ, VOCAB

WARMUP_STEPS = dscompile.WARMUP + 2  # compiled: past the default schedule's switch (and its recompile)


class _Mallinfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _Mallinfo


def _heap_bytes() -> int:
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd  # in use on the heap + in mmapped chunks (large tensors)


class _HeapPeak:
    """The most malloc hands out while it runs, sampled on a thread (torch's kernels release the GIL)."""

    def __enter__(self):
        self.base = self.peak = _heap_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, _heap_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()


def _tensor_bytes() -> int:
    """Bytes of the storages of every tensor alive (each storage once)."""
    storages = {}
    with warnings.catch_warnings():  # some objects torch.distributed keeps warn when their type is asked
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor):
                    continue
                storage = obj.untyped_storage()
                address = storage.data_ptr()
            except (ReferenceError, RuntimeError, NotImplementedError):
                continue  # a dead weak proxy, or a fake tensor compiling left behind (no storage to count)
            storages[address] = max(storages.get(address, 0), storage.nbytes())
    return sum(storages.values())


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size


def run(rank: int, world: int, kind: str, steps: int, backend: str) -> dict:
    torch.manual_seed(0)
    model = GPT()
    runtime = None
    if kind == "ddp":
        trainer = DDP(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step(tokens):
            loss = nn.functional.cross_entropy(trainer(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    else:
        stage = 1 if kind == "zero1" else 3
        cfg = ZeroConfig(stage=stage, stage3_param_persistence_threshold=100_000,
                         stage3_prefetch_bucket_size=5_000_000)
        zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True), cfg)
        if kind.startswith("compiled_zero3"):
            schedule = None  # the default: prefetch and selective gather from step WARMUP
            if kind == "compiled_zero3_nokeep":  # a custom schedule without selective gather (nothing kept)
                schedule = [(0, ["zero3_compile"]), (dscompile.WARMUP, ["zero3_compile", "prefetch"])]
            runtime = dscompile.deepcompile(model, zero, CompileConfig(deepcompile=True), backend=backend,
                                            schedule=schedule)

        def step(tokens):
            loss = nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            zero.backward(loss)
            zero.step()
            zero.zero_grad()
    gen = torch.Generator().manual_seed(rank)
    warmup = WARMUP_STEPS if runtime is not None else 2
    times, compile_s = [], []
    for _ in range(warmup):
        torch.distributed.barrier()
        began = time.perf_counter()
        step(torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen))
        compile_s.append(time.perf_counter() - began)
    gc.collect()
    resident = _tensor_bytes()
    _reset_hwm()
    with _HeapPeak() as heap:
        for _ in range(steps):
            tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen)
            torch.distributed.barrier()
            began = time.perf_counter()
            step(tokens)
            times.append(time.perf_counter() - began)
    result = {"step_s": statistics.median(times), "peak_mb": _hwm_mb(), "warmup_s": compile_s,
              "train_mb": (resident + heap.peak - heap.base) / 2**20, "resident_mb": resident / 2**20}
    if runtime is not None:
        result["stats"] = dict(runtime.stats)
        result["kept"] = len(runtime.kept_units)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--kinds", default="ddp,zero1,zero3,compiled_zero3")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    rows: dict[str, list[dict]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            results = run_ranks(run, 2, kind, args.steps, args.backend, timeout=3600)
            slower = max(results, key=lambda r: r["step_s"])
            slower["peak_mb"] = max(r["peak_mb"] for r in results)
            slower["train_mb"] = max(r["train_mb"] for r in results)
            rows[kind].append(slower)
            print(f"  {kind}: {slower['step_s']:.3f} s/step, peak RSS {slower['peak_mb']:.0f} MB, training peak "
                  f"{slower['train_mb']:.0f} MB (tensors at start {slower['resident_mb']:.0f} MB)", flush=True)
    print(f"GPT 27.4M parameters, 2 gloo ranks, fp32, micro-batch {MICRO} x {SEQ}; {args.steps} timed steps, "
          f"{args.rounds} rounds; ratios are medians of the per-round ratios (same round, same load)")

    def ratio(kind: str, anchor: str, key: str) -> float:
        if anchor not in rows:
            return float("nan")
        return statistics.median(a[key] / b[key] for a, b in zip(rows[kind], rows[anchor]))

    print(f"{'config':<16}{'step (s)':>10}{'x zero1':>9}{'x zero3':>9}{'peak RSS MB':>13}{'training MB':>13}"
          f"{'x zero3':>9}")
    for kind in kinds:
        step = statistics.median(r["step_s"] for r in rows[kind])
        rss = statistics.median(r["peak_mb"] for r in rows[kind])
        train = statistics.median(r["train_mb"] for r in rows[kind])
        print(f"{kind:<16}{step:>10.3f}{ratio(kind, 'zero1', 'step_s'):>9.2f}{ratio(kind, 'zero3', 'step_s'):>9.2f}"
              f"{rss:>13.0f}{train:>13.0f}{ratio(kind, 'zero3', 'train_mb'):>9.2f}")
    if "compiled_zero3" in rows:
        first = statistics.median(r["warmup_s"][0] for r in rows["compiled_zero3"])
        switch = statistics.median(r["warmup_s"][dscompile.WARMUP] for r in rows["compiled_zero3"])
        print(f"compile: first step {first:.1f} s (capture + compile), step {dscompile.WARMUP} {switch:.1f} s "
              f"(profile-driven recompile); kept units {rows['compiled_zero3'][0]['kept']}; "
              f"ops {rows['compiled_zero3'][0]['stats']}")


if __name__ == "__main__":
    main()
