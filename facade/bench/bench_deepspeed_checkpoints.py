"""Loading a DeepSpeed ZeRO-2 checkpoint, and converting it to the universal layout: dstrain against
DeepSpeed 0.19.8 itself, on the same files.

The model is the 27M GPT of the facade's benchmarks (facade/examples/gpt_model.py: vocab 8192, d 512,
6 layers, 8 heads, seq 128), fp32, AdamW, 2 gloo ranks. DeepSpeed (never a dstrain dependency) runs from a
throwaway venv (facade/tests/fixtures/make_deepspeed_fixtures.py says how to make it):

    flock /tmp/dstrain-bench.lock .venv/bin/python facade/bench/bench_deepspeed_checkpoints.py \
        --deepspeed-python /work/tmp/dsvenv/bin/python --rounds 5

DeepSpeed first writes the checkpoint (one step, then save_checkpoint). Each round then times, in an
order that alternates between rounds:
- `load`: `engine.load_checkpoint(dir)` in a fresh pair of ranks per side (the engine built before the
  clock starts; the slower rank's time), DeepSpeed's engine against dstrain's on DeepSpeed's files;
- `convert`: `ds_to_universal --input_folder <tag> --output_folder <new>` as a user runs it (a fresh
  process, interpreter start and imports included), DeepSpeed's against dstrain's, with their default
  workers; and the conversion alone, timed inside that process after its imports.
Before every timed read the checkpoint's pages are evicted from the page cache (fsync, then
posix_fadvise DONTNEED; checked with mincore through `fincore` when it is installed), so each read is
cold, and every conversion writes a new folder. Medians over the rounds, ratios dstrain / DeepSpeed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "facade" / "examples"))

from gpt_model import GPT  # noqa: E402

SIZE = {"vocab": 8192, "seq": 128, "d_model": 512, "layers": 6, "heads": 8}
MICRO = 4
CONFIG = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 10_000,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
TAG = "global_step1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def batch() -> torch.Tensor:
    return torch.randint(0, SIZE["vocab"], (MICRO, SIZE["seq"] + 1), generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------ DeepSpeed's side (its venv)
def deepspeed_rank(rank: int, world: int, port: int, mode: str, directory: str, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(world), DS_ACCELERATOR="cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = GPT(**SIZE)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    if mode == "write":
        engine.backward(engine(batch()))
        engine.step()
        engine.save_checkpoint(directory, tag=TAG)
        return
    torch.distributed.barrier()
    start = time.perf_counter()
    engine.load_checkpoint(directory)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    if rank == 0:
        Path(result).write_text(json.dumps({"load_s": seconds.item()}))


def deepspeed_side(mode: str, directory: str, result: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(deepspeed_rank, args=(2, free_port(), mode, directory, result), nprocs=2, join=True)


# ------------------------------------------------------------------------------ conversions, timed in-process
def convert(which: str, source: str, target: str, result: str) -> None:
    """One conversion in this fresh process: the whole command's imports first, then the conversion timed."""
    if which == "deepspeed":
        from deepspeed.checkpoint import ds_to_universal as tool
    else:
        from dstrain.checkpoint import ds_to_universal as tool
    argv = ["--input_folder", source, "--output_folder", target] + (["--inject_missing_state"]
                                                                    if which == "deepspeed" else [])
    sys.argv = ["ds_to_universal", *argv]
    args = tool.parse_arguments() if which == "deepspeed" else tool.parse_arguments(argv)
    start = time.perf_counter()
    code = tool.main(args)
    seconds = time.perf_counter() - start
    if code not in (None, 0):
        raise SystemExit(code)
    Path(result).write_text(json.dumps({"convert_s": seconds}))


# ------------------------------------------------------------------------------ dstrain's side and the driver
def dstrain_rank(rank: int, world: int, directory: str) -> float:
    import dstrain

    torch.manual_seed(0)
    config = {k: v for k, v in CONFIG.items()}
    engine, *_ = dstrain.initialize(model=GPT(**SIZE), config=config)
    torch.distributed.barrier()
    start = time.perf_counter()
    engine.load_checkpoint(directory)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    return seconds.item()


def evict(directory: Path) -> int:
    """Drop `directory`'s files from the page cache; returns the pages still resident (fincore), or -1."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if shutil.which("fincore") is None:
        return -1
    out = subprocess.run(["fincore", "--noheadings", "--raw", "--output", "PAGES", *map(str, files)],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(line) for line in out.split())


def timed_command(command: list[str], result: Path) -> tuple[float, float]:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO / "facade" / "examples")})
    wall = time.perf_counter() - start
    return wall, json.loads(result.read_text())["convert_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-python", default="/work/tmp/dsvenv/bin/python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default="/work/tmp/bench_deepspeed_checkpoints")
    parser.add_argument("--side", choices=["deepspeed-write", "deepspeed-load", "convert"], help=argparse.SUPPRESS)
    parser.add_argument("--args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "convert":
        convert(*args.args)
        return
    if args.side:
        deepspeed_side(args.side.split("-")[1], *args.args)
        return
    from dscomm.testing import run_ranks

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    checkpoint = work / "ckpt"
    work.mkdir(parents=True)
    me = str(Path(__file__).resolve())
    ds = [args.deepspeed_python, me]
    subprocess.run([*ds, "--side", "deepspeed-write", "--args", str(checkpoint), ""], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    size = sum(p.stat().st_size for p in (checkpoint / TAG).iterdir()) / 2**20
    times: dict[str, list[float]] = {k: [] for k in ("ds_load", "dstrain_load", "ds_convert_wall", "dstrain_convert_wall",
                                                     "ds_convert", "dstrain_convert")}
    resident = []
    for round_index in range(args.rounds):
        result = work / "result.json"
        sides = ["deepspeed", "dstrain"] if round_index % 2 == 0 else ["dstrain", "deepspeed"]
        for side in sides:
            resident.append(evict(checkpoint))
            if side == "deepspeed":
                subprocess.run([*ds, "--side", "deepspeed-load", "--args", str(checkpoint), str(result)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times["ds_load"].append(json.loads(result.read_text())["load_s"])
            else:
                times["dstrain_load"].append(run_ranks(dstrain_rank, 2, str(checkpoint), timeout=600)[0])
        for side in sides:
            target = work / f"universal_{side}_{round_index}"
            resident.append(evict(checkpoint))
            python = args.deepspeed_python if side == "deepspeed" else sys.executable
            wall, inner = timed_command([python, me, "--side", "convert", "--args", side, str(checkpoint / TAG),
                                         str(target), str(result)], result)
            key = "ds" if side == "deepspeed" else "dstrain"
            times[f"{key}_convert_wall"].append(wall)
            times[f"{key}_convert"].append(inner)
            shutil.rmtree(target)
        print(json.dumps({k: round(v[-1], 3) for k, v in times.items()}), flush=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    params = sum(p.numel() for p in GPT(**SIZE).parameters())
    print(json.dumps({"params_M": round(params / 1e6, 1), "checkpoint_MiB": round(size, 1), "rounds": args.rounds,
                      "pages_resident_before_reads": max(resident), "medians_s": {k: round(v, 3) for k, v in
                                                                                  medians.items()},
                      "load_ratio": round(medians["dstrain_load"] / medians["ds_load"], 3),
                      "convert_wall_ratio": round(medians["dstrain_convert_wall"] / medians["ds_convert_wall"], 3),
                      "convert_ratio": round(medians["dstrain_convert"] / medians["ds_convert"], 3)}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
