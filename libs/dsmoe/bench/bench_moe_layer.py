"""The tutorial-size MoE layer: forward + backward + optimizer step on 2 gloo ranks, dsmoe beside DeepSpeed.

Hidden 512, 4 experts of 512-2048-512, top-1, capacity factor 1.25, 512 tokens per rank, fp32, at
ep_size 1 and 2. Each step: the layer's forward and backward, the gate's gradient averaged over both
ranks and each expert's summed over its expert-data-parallel group and divided by the world (what
ZeRO does through the facade), then torch's Adam. Both layers run in this same loop; DeepSpeed's runs
in another interpreter where it is installed (never a dependency):

    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsmoe/bench/bench_moe_layer.py \\
        --deepspeed-python /tmp/dsvenv/bin/python
    flock /tmp/dstrain-bench.lock .venv/bin/python libs/dsmoe/bench/bench_moe_layer.py --dispatch-sweep

`--dispatch-sweep`: one process, 64 experts, forward + backward with the dense einsum dispatch and with
the sparse one. A round measures each implementation once (the median of `--repeats` timed blocks of
`--iters` steps after warm-up, wall time and the busier rank's CPU time); rounds alternate them and
each figure is the median over `--rounds`. `--engine STAGE` trains through dstrain.initialize /
deepspeed.initialize (ZeRO STAGE, AdamW, clipping 1.0) instead of the plain loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

HIDDEN, EXPERTS, TOKENS, CAPACITY = 512, 4, 512, 1.25  # experts are HIDDEN-4xHIDDEN-HIDDEN


def expert(hidden: int = HIDDEN) -> nn.Module:
    return nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))


def build_layer(impl: str, ep_size: int, num_experts: int = EXPERTS, dispatch: str = "auto",
                hidden: int = HIDDEN) -> tuple[nn.Module, object]:
    """(layer, its expert-data-parallel group)."""
    torch.manual_seed(0)
    common = dict(num_experts=num_experts, ep_size=ep_size, k=1, capacity_factor=CAPACITY,
                  eval_capacity_factor=CAPACITY, min_capacity=4)
    if impl == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from deepspeed.moe.layer import MoE
        from deepspeed.utils import groups

        deepspeed.init_distributed(dist_backend="gloo")
        layer = MoE(HIDDEN, expert(), **common)
        layer.set_deepspeed_parallelism()
        return layer, groups._get_expert_data_parallel_group(layer.expert_group_name)
    import dscomm
    from dsmoe import MoE

    layer = MoE(hidden, expert(hidden), dispatch=dispatch, **common)
    if dist.is_initialized():
        layer.set_expert_groups(dscomm.groups.get_expert_parallel_group(ep_size),
                                dscomm.groups.get_expert_data_parallel_group(ep_size))
    return layer, layer.expert_data_group


class LossOf(nn.Module):
    """The layer with the benchmark's loss, for the engines (`--engine`)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, l_aux, _ = self.layer(x)
        return out.float().pow(2).mean() + 0.01 * l_aux


def engine_for(impl: str, ep_size: int, stage: int):
    """dstrain.initialize or deepspeed.initialize on the layer: ZeRO `stage`, AdamW (torch's), fp32."""
    torch.manual_seed(0)
    common = dict(num_experts=EXPERTS, ep_size=ep_size, k=1, capacity_factor=CAPACITY,
                  eval_capacity_factor=CAPACITY, min_capacity=4)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**6,
              "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_optimization": {"stage": stage}}
    if impl == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from deepspeed.moe.layer import MoE

        deepspeed.init_distributed(dist_backend="gloo")
        model = LossOf(MoE(HIDDEN, expert(), **common))
        return deepspeed.initialize(model=model, config=config)[0]
    import dstrain
    from dsmoe import MoE

    model = LossOf(MoE(HIDDEN, expert(), **common))
    return dstrain.initialize(model=model, config=config)[0]


def engine_steps(engine, x: torch.Tensor, count: int) -> None:
    for _ in range(count):
        loss = engine(x)
        engine.backward(loss)
        engine.step()


def is_expert(param: torch.Tensor) -> bool:
    return hasattr(param, "allreduce") and not param.allreduce


def train_steps(layer: nn.Module, expert_data_group, optimizer, x: torch.Tensor, count: int, world: int) -> None:
    for _ in range(count):
        out, l_aux, _ = layer(x)
        (out.float().pow(2).mean() + 0.01 * l_aux).backward()
        for param in layer.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            if world > 1 and (not is_expert(param) or dist.get_world_size(expert_data_group) > 1):
                dist.all_reduce(param.grad, group=expert_data_group if is_expert(param) else None)
            param.grad.div_(world)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)


def rank_main(rank: int, world: int, init_file: str, impl: str, ep_sizes: list[int], iters: int, repeats: int,
              threads: int, stage: int | None, queue) -> None:
    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    for ep in ep_sizes:
        x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(rank))
        if stage is None:
            layer, group = build_layer(impl, ep)
            optimizer = torch.optim.Adam(layer.parameters(), lr=1e-4)

            def run(count, layer=layer, group=group, optimizer=optimizer, x=x):
                train_steps(layer, group, optimizer, x, count, world)
        else:
            engine = engine_for(impl, ep, stage)

            def run(count, engine=engine, x=x):
                engine_steps(engine, x, count)
        run(3)  # warm-up
        walls, cpus = [], []
        for _ in range(repeats):
            dist.barrier()
            began, cpu_began = time.perf_counter(), time.process_time()
            run(iters)
            cpu = torch.tensor([time.process_time() - cpu_began])
            dist.barrier()
            walls.append((time.perf_counter() - began) / iters)
            dist.all_reduce(cpu, op=dist.ReduceOp.MAX)  # the busier rank's CPU seconds
            cpus.append(cpu.item() / iters)
        results[ep] = [statistics.median(walls), statistics.median(cpus)]
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def measure(impl: str, ep_sizes: list[int], iters: int, repeats: int, threads: int,
            stage: int | None = None) -> dict[int, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, 2, f"{tmp}/init", impl, ep_sizes, iters, repeats, threads,
                                                      stage, queue)) for r in range(2)]
        for proc in procs:
            proc.start()
        results = queue.get(timeout=1800)
        for proc in procs:
            proc.join(timeout=60)
    return results


def dispatch_sweep(num_experts: int, iters: int, repeats: int, threads: int, tokens: int = TOKENS,
                   hidden: int = HIDDEN) -> dict[str, float]:
    torch.set_num_threads(threads)
    found = {}
    for mode in ("dense", "sparse"):
        layer, _ = build_layer("dsmoe", 1, num_experts, dispatch=mode, hidden=hidden)
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0))
        times = []
        for block in range(repeats + 1):
            began = time.perf_counter()
            for _ in range(iters):
                out, l_aux, _ = layer(x)
                (out.pow(2).mean() + 0.01 * l_aux).backward()
            if block:  # the first block warms up
                times.append((time.perf_counter() - began) / iters)
        found[mode] = statistics.median(times)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["dsmoe", "deepspeed"], default="dsmoe")
    parser.add_argument("--ep", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (2 ranks share the cores)")
    parser.add_argument("--deepspeed-python", help="an interpreter with DeepSpeed installed: measure it too")
    parser.add_argument("--dispatch-sweep", action="store_true", help="dense vs sparse dispatch, one process")
    parser.add_argument("--experts", type=int, default=64, help="experts for --dispatch-sweep")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens for --dispatch-sweep")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="hidden size for --dispatch-sweep")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each implementation")
    parser.add_argument("--engine", type=int, default=None, metavar="STAGE",
                        help="train through dstrain.initialize / deepspeed.initialize at this ZeRO stage instead")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    if args.dispatch_sweep:
        found = dispatch_sweep(args.experts, args.iters, args.repeats, args.threads, args.tokens, args.hidden)
        print(f"{args.experts} experts of {args.hidden}-{4 * args.hidden}-{args.hidden}, {args.tokens} tokens, "
              f"forward + backward: dense {found['dense'] * 1e3:.2f} ms, sparse {found['sparse'] * 1e3:.2f} ms "
              f"(sparse / dense {found['sparse'] / found['dense']:.2f})")
        return
    if args.json:
        print(json.dumps(measure(args.impl, args.ep, args.iters, args.repeats, args.threads, args.engine)))
        return
    # Rounds alternate the two implementations, so a burst of load from elsewhere hits both alike. Wall
    # time is what a step takes; CPU time (the busier rank's) is what it costs, and moves less with load.
    ours: dict[int, list[list[float]]] = {ep: [] for ep in args.ep}
    theirs: dict[int, list[list[float]]] = {ep: [] for ep in args.ep}
    for _ in range(args.rounds):
        for ep, value in measure(args.impl, args.ep, args.iters, args.repeats, args.threads, args.engine).items():
            ours[ep].append(value)
        if args.deepspeed_python:
            for ep, value in deepspeed_figures(args).items():
                theirs[ep].append(value)
    what = f"ZeRO-{args.engine} engine" if args.engine is not None else "plain loop"
    for ep in args.ep:
        line = f"ep_size {ep} ({what}): {args.impl} " + _figures(ours[ep])
        if theirs[ep]:
            line += ", deepspeed " + _figures(theirs[ep])
            for index, kind in enumerate(("wall", "cpu")):
                ratio = statistics.median(r[index] for r in ours[ep]) / statistics.median(r[index] for r in theirs[ep])
                line += f"; dsmoe / deepspeed {kind} {ratio:.2f}"
        print(line, flush=True)


def _figures(rounds: list[list[float]]) -> str:
    wall = [r[0] for r in rounds]
    cpu = [r[1] for r in rounds]
    return (f"{statistics.median(wall):.3f} s/step wall (best {min(wall):.3f}), "
            f"{statistics.median(cpu):.3f} s cpu (best {min(cpu):.3f})")

def deepspeed_figures(args: argparse.Namespace) -> dict[int, float]:
    command = [args.deepspeed_python, __file__, "--impl", "deepspeed", "--json", "--ep", *map(str, args.ep),
               "--iters", str(args.iters), "--repeats", str(args.repeats), "--threads", str(args.threads),
               *(["--engine", str(args.engine)] if args.engine is not None else [])]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    if done.returncode != 0:
        sys.exit(f"DeepSpeed's run failed:\n{done.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}

if __name__ == "__main__":
    main()
