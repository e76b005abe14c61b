"""`PipelineRuntime`: a PipelineModule trained and evaluated on real ranks by a named schedule.

    runtime = PipelineRuntime(module, groups, schedule="zb_h1")
    loss = runtime.train_batch(data_iter, AveragedOptimizer(optimizer, groups.data), micro_batches=8)
    loss = runtime.eval_batch(data_iter, micro_batches=8)

Each batch runs this rank's lowered program (dspipe.schedules: generator -> lower), one `BatchRun`.
The loss is the mean over the batch's micro-batches, averaged over the data-parallel replicas and
broadcast from the rank holding the last stage, so every rank returns it.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

import dscomm

from ..errors import PipelineError, ScheduleError
from ..module import PipelineModule
from ..schedules import Action, Kind, Placement, TraceRecorder, build_schedule, lower, write_trace
from ..schedules import placement as schedule_placement
from ..schedules.registry import schedule_name
from .executor import BatchRun
from .p2p import Messenger
from .sync import GradientSync

REDUCE_OUTPUTS = ("avg", None)
_LOSS_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # what a mean loss is returned as


class PipelineRuntime:
    """Runs `module` (built for this rank's stages) with schedule `schedule` over `groups` (the run's
    dscomm.ParallelGroups; None in a world of one). `timeout`: how long any pipeline wait may take
    (default: dscomm's process-group timeout)."""

    def __init__(self, module: PipelineModule, groups: Any = None, schedule: str = "1f1b", *,
                 timeout: datetime.timedelta | float | None = None, device: torch.device | None = None,
                 input_hook: Callable[[Any], Any] | None = None,
                 forward_context: Callable[[], Any] | None = None):
        if not isinstance(module, PipelineModule):
            raise PipelineError(f"PipelineRuntime runs a dspipe.PipelineModule, got {type(module).__name__}")
        self.module = module
        self.groups = groups
        if groups is not None and groups.dims != module.dims:
            raise PipelineError(f"the module was built for the layout {module.dims} but the groups are of "
                                f"{groups.dims}; build the module and the groups from the same ParallelDims")
        self.schedule = check_schedule(schedule, module.placement)
        self.placement: Placement = module.placement
        self.pipe_rank = module.stage_id
        self.device = device or _module_device(module)
        pipe_ranks = module.dims.ranks_of("pipe", module.global_rank)
        if isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        self.timeout = timeout or dscomm.get_timeout()
        self.messenger = Messenger(pipe_ranks, self.pipe_rank, self.timeout, module.dynamic_shape, self.device)
        self.input_hook = input_hook
        self.forward_context = forward_context
        self.recorder: TraceRecorder | None = None
        self.last_outputs: list[Any] | None = None
        self.last_step_applied: bool | None = None

    # ---------------------------------------------------------------------------------------- programs
    def program(self, micro_batches: int, training: bool = True) -> list[Action]:
        """This rank's lowered program for a batch of `micro_batches`."""
        return _programs(self.schedule if training else "inference", self.placement, micro_batches)[self.pipe_rank]

    # ---------------------------------------------------------------------------------------- batches
    def train_batch(self, data_iter: Iterator[Any] | None, sync: GradientSync, micro_batches: int) -> torch.Tensor:
        """Forward and backward of `micro_batches` micro-batches by the schedule, then the optimizer step
        (`sync.step()`); returns the batch's mean loss on every rank."""
        if not torch.is_grad_enabled():
            raise PipelineError("train_batch() needs gradients enabled; use eval_batch() under torch.no_grad()")
        self.module.train()
        sync.require_gradient_sync(False)
        run = self._run(data_iter, micro_batches, training=True, sync=sync)
        self.last_step_applied = run.applied
        return self._mean_loss(run, micro_batches, bcast=True)

    def eval_batch(self, data_iter: Iterator[Any] | None, micro_batches: int, *, compute_loss: bool = True,
                   reduce_output: str | None = "avg", bcast_loss: bool = True, return_logits: bool = False) -> Any:
        """Forward only. reduce_output="avg": the mean loss (or output) over the micro-batches and the
        data-parallel replicas; None: the list of per-micro-batch values (on the last stage's rank)."""
        if reduce_output not in REDUCE_OUTPUTS:
            raise PipelineError(f"eval_batch(reduce_output={reduce_output!r}): valid values are 'avg' and None")
        was_training = self.module.training
        self.module.eval()
        try:
            run = self._run(data_iter, micro_batches, training=False, sync=None, compute_loss=compute_loss,
                            keep_outputs=return_logits)
        finally:
            self.module.train(was_training)
        if reduce_output == "avg":
            result = self._mean_loss(run, micro_batches, bcast=bcast_loss)
        else:
            result = [run.losses[m] for m in sorted(run.losses)] if run.losses else None
        if return_logits:
            self.last_outputs = [run.outputs[m] for m in sorted(run.outputs)] or None
            return result, (self.last_outputs[-1] if self.last_outputs else None)
        return result

    def _run(self, data_iter: Iterator[Any] | None, micro_batches: int, *, training: bool,
             sync: GradientSync | None, compute_loss: bool = True, keep_outputs: bool = False) -> BatchRun:
        _check_count(micro_batches)
        holds_data = self.pipe_rank in (self.placement.first_stage_rank, self.placement.last_stage_rank)
        if holds_data and data_iter is None:
            raise PipelineError(f"rank {self.module.global_rank} holds the first or the last stage and needs data: "
                                f"pass a data iterator (or set one with set_dataiterator / training_data)")

        def next_batch() -> Any:
            return next(data_iter)

        run = BatchRun(module=self.module, program=self.program(micro_batches, training), micro_batches=micro_batches,
                       messenger=self.messenger, next_batch=next_batch, device=self.device, training=training,
                       sync=sync, compute_loss=compute_loss, keep_outputs=keep_outputs, input_hook=self.input_hook,
                       forward_context=self.forward_context, recorder=self.recorder)
        run.run()
        return run

    def _mean_loss(self, run: BatchRun, micro_batches: int, bcast: bool) -> torch.Tensor | None:
        """The mean of the micro-batches' losses, averaged over the replicas, on every rank (bcast), in the losses'
        dtype as DeepSpeed returns it (summed in float64; the dtype travels with the value to the other stages)."""
        loss_rank = self.placement.last_stage_rank
        value = torch.zeros(2, dtype=torch.float64)  # [mean, index of its dtype in _LOSS_DTYPES]
        if self.pipe_rank == loss_rank:
            losses = [run.losses[m] for m in sorted(run.losses)]
            if not losses or not all(torch.is_tensor(t) and t.numel() == 1 for t in losses):
                raise PipelineError("the last stage must produce a one-element loss per micro-batch to average "
                                    "(give PipelineModule a loss_fn, or eval_batch(reduce_output=None))")
            value[0] = torch.stack([t.reshape(()).to(torch.float64).cpu() for t in losses]).sum() / micro_batches
            dtype = losses[0].dtype
            value[1] = _LOSS_DTYPES.index(dtype) if dtype in _LOSS_DTYPES else _LOSS_DTYPES.index(torch.float32)
            if self.groups is not None and self.groups.size("data") > 1:
                mean = value[:1].clone()
                dscomm.all_reduce(mean, group=self.groups.data, log_name="pipe_loss")
                value[0] = mean[0] / self.groups.size("data")
        if bcast and self.groups is not None and self.groups.size("pipe") > 1:
            source = self.module.dims.ranks_of("pipe", self.module.global_rank)[loss_rank]
            dscomm.broadcast(value, source, group=self.groups.pipe, log_name="pipe_loss")
        elif self.pipe_rank != loss_rank:
            return None
        return value[0].to(_LOSS_DTYPES[int(value[1])])

    # ---------------------------------------------------------------------------------------- the rest
    def reset_activation_shape(self) -> None:
        """Exchange activation shapes again on the next batch (call it on every rank)."""
        self.messenger.reset_shapes()

    @contextlib.contextmanager
    def tracing(self, clock: Callable[[], float] | None = None) -> Iterator[TraceRecorder]:
        """Record every action this rank runs while inside; the recorder's events are the measured trace."""
        recorder = TraceRecorder(self.pipe_rank, clock) if clock else TraceRecorder(self.pipe_rank)
        self.recorder = recorder
        try:
            yield recorder
        finally:
            self.recorder = None

    def write_trace(self, path: str | Path, recorder: TraceRecorder) -> None:
        """The recorded actions as dspipe's JSON trace (`dspipe show --from-trace` draws it)."""
        write_trace(path, recorder.events)


def check_schedule(name: str, module_placement: Placement) -> str:
    """The canonical schedule name, refused when its placement is not the module's."""
    try:
        key = schedule_name(name)
        chunks = module_placement.stages // module_placement.ranks
        wanted = schedule_placement(key, module_placement.ranks,
                                    chunks=chunks if key == "interleaved_1f1b" else None)
    except ScheduleError as exc:
        raise PipelineError(f"pipeline schedule {name!r}: {exc}") from None
    if wanted != module_placement:
        raise PipelineError(
            f"pipeline schedule {key!r} runs on a {wanted.shape} placement of {wanted.stages} stages on "
            f"{wanted.ranks} ranks, but the module is cut into {module_placement.stages} stages placed "
            f"{module_placement.shape}: {_advice(key)}")
    return key


def _advice(key: str) -> str:
    if key in ("zbv", "dualpipev"):
        return "build a DualPipeVModule"
    if key == "interleaved_1f1b":
        return "build the PipelineModule with chunks=2 (or more) stages per rank"
    return "build a PipelineModule with one stage per rank (chunks=1)"


@lru_cache(maxsize=64)
def _programs(name: str, layout: Placement, micro_batches: int) -> list[list[Action]]:
    ranks = layout.ranks
    if name == "inference" and layout.stages != ranks:
        compute = _forward_only(layout, micro_batches)  # every stage in (micro-batch, stage) order
    else:
        chunks = layout.stages // ranks
        compute = build_schedule(name, ranks, micro_batches, chunks if name == "interleaved_1f1b" else None)
    return lower(compute, layout)


def _forward_only(layout: Placement, micro_batches: int) -> list[list[Action]]:
    return [[Action(Kind.F, s, m) for m in range(micro_batches) for s in layout.stages_of(r)]
            for r in range(layout.ranks)]


def _check_count(micro_batches: Any) -> None:
    if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
        raise PipelineError(f"micro_batches must be an int >= 1, got {micro_batches!r}")


def _module_device(module: torch.nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    return torch.device("cpu")
