"""train_batch time per schedule: dspipe against torch.distributed.pipelining's schedule of the same name.

The model of DeepSpeed's pipeline tutorial size: 8 x (Linear 1024 -> 1024, ReLU), fp32, 8 micro-batches,
2 stages on 2 gloo ranks (one CPU thread each). Every round runs each schedule once with dspipe and once
with torch, in turn (interleaved, so machine load hits both alike); the figures are medians over rounds
of the slower rank's wall time for one train_batch (forward, backward and an SGD step). dspipe's runs
also record a trace, from which the measured bubble is computed and compared with the simulator's, fed
the measured per-stage op times.

    flock /tmp/dstrain-bench.lock python libs/dspipe/bench/bench_train_batch.py [--rounds 15] [--micro 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

import dscomm
from dscomm.testing import run_ranks
from dspipe import DualPipeVModule, LayerSpec, PipelineModule
from dspipe.runtime import AveragedOptimizer, PipelineRuntime
from dspipe.schedules import Timeline, TraceEvent, build_schedule, lower
from dspipe.schedules import placement as schedule_placement
from dspipe.schedules.simulate import execute

WIDTH, LAYERS, MICRO_BATCHES = 1024, 8, 8
TRACED = 5  # batches traced per schedule for the bubble (medians)
SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev")
TORCH_NAMES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved_1f1b": "ScheduleInterleaved1F1B",
               "zb_h1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
               "dualpipev": "ScheduleDualPipeV"}


def layer_list() -> list:
    layers: list = []
    for _ in range(LAYERS):
        layers += [LayerSpec(nn.Linear, WIDTH, WIDTH), nn.ReLU()]
    return layers


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def data(micro: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(micro, WIDTH, generator=gen), torch.randn(micro, WIDTH, generator=gen))
            for _ in range(MICRO_BATCHES)]


# ---------------------------------------------------------------------------------------------- dspipe
def dspipe_runner(schedule: str, dims: dscomm.ParallelDims, groups, micro: int):
    kind = DualPipeVModule if schedule in ("zbv", "dualpipev") else PipelineModule
    extra = {"chunks": 2} if schedule == "interleaved_1f1b" else {}
    module = kind(layer_list(), topology=dims, loss_fn=loss_fn, partition_method="uniform", **extra)
    runtime = PipelineRuntime(module, groups, schedule)
    sync = AveragedOptimizer(torch.optim.SGD(module.parameters(), lr=1e-4), groups.data)
    batches = data(micro)

    def run(trace: bool = False):
        if not trace:
            runtime.train_batch(iter(batches), sync, MICRO_BATCHES)
            return None
        with runtime.tracing() as recorder:
            runtime.train_batch(iter(batches), sync, MICRO_BATCHES)
        return recorder.events

    return run


# ---------------------------------------------------------------------------------------------- torch
def torch_runner(schedule: str, groups, micro: int):
    from torch.distributed import pipelining

    rank, ranks = dscomm.get_rank(), dscomm.get_world_size()
    v_shape = schedule in ("zbv", "dualpipev")
    per_rank = 2 if schedule in ("zbv", "dualpipev", "interleaved_1f1b") else 1
    total = ranks * per_rank
    if v_shape:
        mine = [rank, 2 * ranks - 1 - rank]
    else:
        mine = [rank + ranks * c for c in range(per_rank)]
    bounds = [len(layer_list()) * s // total for s in range(total + 1)]
    stages, params = [], []
    specs = layer_list()
    for index in mine:
        torch.manual_seed(1234 + index)
        submodule = nn.Sequential(*[spec.build() if isinstance(spec, LayerSpec) else spec
                                    for spec in specs[bounds[index]:bounds[index + 1]]])
        params += list(submodule.parameters())
        stages.append(pipelining.PipelineStage(submodule, index, total, torch.device("cpu"), group=groups.pipe))
    cls = getattr(pipelining.schedules, TORCH_NAMES[schedule])
    runner = cls(stages if per_rank > 1 or schedule == "zb_h1" else stages[0], n_microbatches=MICRO_BATCHES,
                 loss_fn=loss_fn)
    optimizer = torch.optim.SGD(params, lr=1e-4)
    batches = data(micro)
    inputs = torch.cat([x for x, _ in batches])
    targets = torch.cat([y for _, y in batches])
    holds_first = 0 in mine
    holds_last = total - 1 in mine

    def run(trace: bool = False):
        args = (inputs,) if holds_first else ()
        runner.step(*args, target=targets if holds_last else None)
        optimizer.step()
        optimizer.zero_grad()

    return run


# ---------------------------------------------------------------------------------------------- the run
def timed(run, group) -> float:
    dscomm.barrier()
    start = time.perf_counter()
    run()
    seconds = torch.tensor([time.perf_counter() - start])
    dscomm.all_reduce(seconds, op=dscomm.ReduceOp.MAX)
    return seconds.item()


def _aligned(run):
    dscomm.barrier()  # every rank starts the traced batch together, as the simulator's ranks do
    return run(trace=True)


def bench_rank(rank, world, rounds, micro, schedules, with_torch):
    dims = dscomm.ParallelDims(world, pipe=world)
    groups = dims.build()
    runners = {}
    for name in schedules:
        runners[("dspipe", name)] = dspipe_runner(name, dims, groups, micro)
        if with_torch:
            try:
                runners[("torch", name)] = torch_runner(name, groups, micro)
            except Exception as exc:  # a torch schedule that cannot run here is reported, not fatal
                runners[("torch", name)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    times: dict[str, list[float]] = {}
    for run in runners.values():  # warm-up: allocations, shape exchange
        if callable(run):
            for _ in range(2):
                run()
    for _ in range(rounds):
        for key, run in runners.items():
            if callable(run):
                times.setdefault(f"{key[0]}:{key[1]}", []).append(timed(run, groups))
    traces = {name: [_aligned(runners[("dspipe", name)]) for _ in range(TRACED)] for name in schedules}
    return {"times": times, "errors": {f"{k[0]}:{k[1]}": v for k, v in runners.items() if isinstance(v, str)},
            "traces": traces}


def bubbles(name: str, events: list) -> tuple[float, float]:
    """(the measured bubble of one traced batch, the simulator's given that batch's measured op times).

    The simulator runs the lowered program with every action's measured duration, the bookkeeping up to
    the rank's next action included, and the measured message latency; a receive costs only that
    bookkeeping, its wait being what the simulator derives from when the matching send ended. Both count
    everything but F/B/I/W as idle."""
    ranks = 1 + max(e.rank for e in events)
    program = lower(build_schedule(name, ranks, MICRO_BATCHES), schedule_placement(name, ranks))
    durations = []
    for rank, actions in enumerate(program):
        mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
        if [e.action for e in mine] != actions:
            raise RuntimeError(f"rank {rank}'s trace does not follow its lowered program")
        ends = [following.start for following in mine[1:]] + [mine[-1].end]
        durations.append([(end - e.end) if e.action.kind.is_recv else (end - e.start) for e, end in zip(mine, ends)])
    starts = execute(program, durations, message_latency(events))
    simulated = Timeline([TraceEvent(rank, action, starts[rank][i], starts[rank][i] + durations[rank][i])
                          for rank, actions in enumerate(program) for i, action in enumerate(actions)], ranks)
    return Timeline.of(events).bubble, simulated.bubble


def message_latency(events: list) -> float:
    """The median time from a send's end to its receive's end, over the messages whose receiver was already
    waiting (so the time is the transfer's, not the receiver's lateness)."""
    sends = {e.action.message_key(): e for e in events if e.action.kind.is_send}
    latencies = []
    for event in events:
        if event.action.kind.is_recv:
            send = sends.get(event.action.message_key())
            if send is not None and event.start <= send.end:
                latencies.append(event.end - send.end)
    return statistics.median(latencies) if latencies else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--micro", type=int, default=32, help="rows per micro-batch")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    schedules = tuple(args.schedules.split(","))
    results = run_ranks(bench_rank, 2, args.rounds, args.micro, schedules, not args.no_torch, timeout=3600)
    times, errors = results[0]["times"], results[0]["errors"]
    print(f"{LAYERS} x Linear {WIDTH} + ReLU, {MICRO_BATCHES} micro-batches of {args.micro}, 2 stages on 2 gloo "
          f"ranks (1 thread each), fp32; median of {args.rounds} interleaved rounds")
    print(f"{'schedule':<18}{'dspipe s':>10}{'torch s':>10}{'ratio':>8}{'bubble':>9}{'simulated':>11}"
          f"{'diff':>7}")
    report = {}
    for name in schedules:
        ours = statistics.median(times[f"dspipe:{name}"])
        theirs = times.get(f"torch:{name}")
        theirs_median = statistics.median(theirs) if theirs else None
        pairs = [bubbles(name, [e for r in results for e in r["traces"][name][i]]) for i in range(TRACED)]
        measured = statistics.median(m for m, _ in pairs)
        simulated = statistics.median(s for _, s in pairs)
        ratio = f"{ours / theirs_median:.2f}" if theirs_median else "-"
        torch_text = f"{theirs_median:.3f}" if theirs_median else "n/a"
        diff = f"{(measured - simulated) / simulated:+.0%}" if simulated else "-"
        print(f"{name:<18}{ours:>10.3f}{torch_text:>10}{ratio:>8}{measured:>9.3f}{simulated:>11.3f}{diff:>7}")
        report[name] = {"dspipe": ours, "torch": theirs_median, "bubble": measured, "simulated": simulated}
    for key, message in errors.items():
        print(f"  {key} did not run: {message}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"report": report, "times": times, "errors": errors}, handle, indent=1)


if __name__ == "__main__":
    main()
