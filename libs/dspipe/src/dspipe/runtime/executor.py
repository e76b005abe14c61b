"""One batch of one rank's program, action by action.

State lives per (stage, micro-batch) in a `Work` and goes when its last backward (or, in evaluation,
its forward) is done. A lowered program says where each send, receive, load and step goes; a program
of compute actions only gets them where they belong: receive just before the compute that needs the
data, send right after the compute that made it, tied gradients, reduction and step at the end. Both
are deadlock-free for a valid schedule, since sends never block and a rank waits only for its own
inputs. Stages on the same rank hand over directly, without messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dscomm import watchdog

from ..errors import PipelineError
from ..schedules.action import Action, Kind
from .compute import (
    Work,
    attach_loss,
    backward_full,
    backward_input,
    backward_weights,
    floats,
    fresh_leaves,
    run_forward,
)
from .p2p import Messenger
from .sync import GradientSync
from .wire import flatten, unflatten

LOOKAHEAD = 4  # receives posted ahead of their wait, at most


class BatchRun:
    """Runs `program` for one batch of `micro_batches` on this rank (see the module docstring)."""

    def __init__(self, *, module: Any, program: list[Action], micro_batches: int, messenger: Messenger,
                 next_batch: Callable[[], Any], device: torch.device, training: bool, sync: GradientSync | None,
                 compute_loss: bool = True, keep_outputs: bool = False, input_hook: Callable[[Any], Any] | None = None,
                 forward_context: Callable[[], Any] | None = None, recorder: Any = None):
        self.module = module
        self.placement = module.placement
        self.rank = module.stage_id
        self.last_stage = self.placement.stages - 1
        self.local_stages = set(self.placement.stages_of(self.rank))
        self.program = program
        self.micro_batches = micro_batches
        self.messenger = messenger
        self.next_batch = next_batch
        self.device = device
        self.training = training
        self.sync = sync
        self.compute_loss = compute_loss
        self.keep_outputs = keep_outputs
        self.input_hook = input_hook
        self.forward_context = forward_context
        self.recorder = recorder
        self.lowered = any(a.kind.is_comm or a.kind in (Kind.STEP, Kind.REDUCE_GRAD) for a in program)
        self.split_stages = {a.stage for a in program if a.kind in (Kind.I, Kind.W)}
        self.scale = (sync.backward_scale if sync is not None else 1.0) / micro_batches
        self.works: dict[tuple[int, int], Work] = {}
        self.batches: dict[int, Any] = {}
        self.labels: dict[int, Any] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, Any] = {}
        self.reduced_stages: set[int] = set()
        self.tied_reduced = not module.tied_comms
        self.finished = False
        self.applied: bool | None = None
        # Receives posted ahead of the action that waits for them (see _post_ahead), by their action.
        self.posted: dict[Action, Any] = {}
        self.upcoming = [i for i, a in enumerate(program) if a.kind.is_recv]

    # ---------------------------------------------------------------------------------------- the loop
    def run(self) -> None:
        handlers = {Kind.F: self._forward, Kind.B: self._backward, Kind.I: self._backward_input,
                    Kind.W: self._backward_weights, Kind.SEND_F: self._send_output, Kind.RECV_F: self._recv_input,
                    Kind.SEND_B: self._send_input_grads, Kind.RECV_B: self._recv_output_grads, Kind.LOAD: self._load,
                    Kind.REDUCE_TIED: self._reduce_tied, Kind.REDUCE_GRAD: self._reduce_grad, Kind.STEP: self._step}
        grad_mode = torch.enable_grad() if self.training else torch.no_grad()
        with grad_mode:
            for index, action in enumerate(self.program):
                watchdog.record(self._describe(action))  # what dscomm's watchdog names, should this rank stop
                with self._recorded(action):
                    handlers[action.kind](action)
                if self.lowered:
                    self._post_ahead(index)
            if self.training and not self.lowered:
                self._reduce_tied(None)
                for stage in sorted(self.local_stages):
                    self._reduce_grad(Action(Kind.REDUCE_GRAD, stage))
                self._step(None)
        self.messenger.wait_sends()
        leftover = [f"{s}:{m}" for (s, m), w in self.works.items() if self.training and not w.weights_done]
        if leftover:
            raise PipelineError(f"rank {self.module.global_rank}: the schedule ended with backward passes missing for "
                                f"(stage:micro-batch) {', '.join(leftover[:8])}")

    def _describe(self, action: Action) -> str:
        where = f"pipeline action {action} on rank {self.module.global_rank} (pipeline rank {self.rank})"
        if action.kind.is_comm:
            stage = action.stage + (1 if action.kind in (Kind.SEND_F, Kind.RECV_B) else -1)
            return f"{where}, with pipeline rank {self.placement.rank_of[stage]}"
        return where

    @contextlib.contextmanager
    def _recorded(self, action: Action) -> Iterator[None]:
        if self.recorder is None:
            yield
        else:
            with self.recorder.record(action):
                yield

    def work(self, stage: int, micro_batch: int) -> Work:
        key = (stage, micro_batch)
        if key not in self.works:
            if stage not in self.local_stages:
                raise PipelineError(f"rank {self.module.global_rank} (pipeline rank {self.rank}) was given an action "
                                    f"of stage {stage}, which it does not hold (it holds {sorted(self.local_stages)})")
            self.works[key] = Work(stage, micro_batch)
        return self.works[key]

    # ---------------------------------------------------------------------------------------- data
    def _batch(self, micro_batch: int) -> Any:
        while micro_batch not in self.batches:
            index = len(self.batches)
            try:
                batch = self.next_batch()
            except StopIteration:
                raise PipelineError(f"rank {self.module.global_rank}: the data iterator ran out at micro-batch {index} "
                                    f"of {self.micro_batches}; wrap the loader in RepeatingLoader or give more "
                                    f"data") from None
            if not isinstance(batch, (tuple, list)) or len(batch) < 2:
                raise PipelineError(f"rank {self.module.global_rank}: micro-batch {index} is a "
                                    f"{type(batch).__name__}; a pipeline's data iterator yields (inputs, labels) "
                                    f"pairs (the first stage reads inputs, the last labels)")
            self.batches[index] = batch
        return self.batches[micro_batch]

    def _load(self, action: Action) -> None:
        stage, micro_batch = action.stage, action.micro_batch
        batch = self._batch(micro_batch)
        if stage == 0 and self.work(0, micro_batch).inputs is None:
            inputs = _to_device(batch[0], self.device)
            self.work(0, micro_batch).inputs = self.input_hook(inputs) if self.input_hook else inputs
        if stage == self.last_stage and micro_batch not in self.labels:
            self.labels[micro_batch] = _to_device(batch[1], self.device)

    # ---------------------------------------------------------------------------------------- forward
    def _inputs(self, work: Work, action: Action) -> Any:
        if work.inputs is not None:
            return work.inputs
        if work.stage == 0:
            self._load(Action(Kind.LOAD, 0, work.micro_batch))
            return work.inputs
        if self.placement.rank_of[work.stage - 1] == self.rank:
            previous = self.works.get((work.stage - 1, work.micro_batch))
            if previous is None or previous.output is None:
                raise PipelineError(f"rank {self.module.global_rank}: {action} needs stage {work.stage - 1}'s "
                                    f"output for micro-batch {work.micro_batch}, which has not run")
            work.inputs = fresh_leaves(previous.output) if self.training else previous.output
            if not self.training:
                previous.output = None
                self._release(previous)
            return work.inputs
        self._recv_input(Action(Kind.RECV_F, work.stage, work.micro_batch))
        return work.inputs

    def _forward(self, action: Action) -> None:
        work = self.work(action.stage, action.micro_batch)
        inputs = self._inputs(work, action)
        context = self.forward_context() if self.forward_context else contextlib.nullcontext()
        with context:
            pieces = run_forward(self.module.stage_segments(work.stage), inputs, work.stage in self.split_stages)
            if work.stage == self.last_stage:
                if self.keep_outputs:
                    self.outputs[work.micro_batch] = _detached(pieces[-1].output)
                labels = self._label(work.micro_batch)
                loss = attach_loss(pieces, self.module.loss_fn, labels, self.compute_loss)
                self.losses[work.micro_batch] = _detached(loss)
                self.labels.pop(work.micro_batch, None)
                work.loss = loss if self.training else None
        if work.stage != self.last_stage:
            work.output = pieces[-1].output
        if self.training:
            work.pieces = pieces
        else:
            work.inputs = None
            if work.stage == self.last_stage:
                del self.works[(work.stage, work.micro_batch)]
        if not self.lowered and work.stage != self.last_stage:
            self._send_output(action)

    def _label(self, micro_batch: int) -> Any:
        if micro_batch not in self.labels:
            self._load(Action(Kind.LOAD, self.last_stage, micro_batch))
        return self.labels[micro_batch]

    def _send_output(self, action: Action | None) -> None:
        work = self.work(action.stage, action.micro_batch)
        target = self.placement.rank_of[work.stage + 1]
        if target == self.rank:
            return  # the next stage takes it directly
        tensors, is_tuple = flatten(work.output, f"rank {self.module.global_rank}, stage {work.stage} output")
        self.messenger.send_activations(tensors, is_tuple, work.stage, work.micro_batch, target, action)
        if not self.training:
            work.output = None
            self._release(work)

    def _recv_input(self, action: Action) -> None:
        """Wait for the receive right here (lower's model: receives block where they stand), so the forward
        that follows measures compute only; it was usually posted ahead (_post_ahead)."""
        source = self.placement.rank_of[action.stage - 1]
        if source == self.rank:
            return
        work = self.work(action.stage, action.micro_batch)
        pending = self.posted.pop(action, None) or \
            self.messenger.recv_activations(action.stage - 1, action.micro_batch, source, action)
        value = unflatten(self.messenger.wait(pending), pending.is_tuple)
        work.inputs = fresh_leaves(value) if self.training else value

    # ---------------------------------------------------------------------------------------- backward
    def _output_grads(self, work: Work, action: Action) -> None:
        if work.stage == self.last_stage or work.output_grads is not None:
            return
        if self.placement.rank_of[work.stage + 1] == self.rank:
            following = self.works.get((work.stage + 1, work.micro_batch))
            if following is None or following.input_grads is None:
                raise PipelineError(f"rank {self.module.global_rank}: {action} needs the input gradient of stage "
                                    f"{work.stage + 1} for micro-batch {work.micro_batch}, not computed yet")
            work.output_grads, following.input_grads = following.input_grads, None
            self._release(following)
            return
        self._recv_output_grads(Action(Kind.RECV_B, work.stage, work.micro_batch))

    def _backward(self, action: Action) -> None:
        work = self.work(action.stage, action.micro_batch)
        self._output_grads(work, action)
        if work.stage in self.split_stages:
            backward_input(work, self.scale)
            backward_weights(work)
        else:
            backward_full(work, self.scale)
        self._after_input_grads(work, action)

    def _backward_input(self, action: Action) -> None:
        work = self.work(action.stage, action.micro_batch)
        self._output_grads(work, action)
        backward_input(work, self.scale)
        self._after_input_grads(work, action)

    def _backward_weights(self, action: Action) -> None:
        work = self.work(action.stage, action.micro_batch)
        if not work.input_done:
            raise PipelineError(f"rank {self.module.global_rank}: {action} runs before its input-gradient pass "
                                f"{work.stage}I{work.micro_batch}; the schedule is malformed")
        backward_weights(work)
        self._release(work)

    def _after_input_grads(self, work: Work, action: Action) -> None:
        work.output_grads = None
        work.loss = None
        if not self.lowered and work.stage > 0:
            self._send_input_grads(action)
        self._release(work)

    def _send_input_grads(self, action: Action) -> None:
        work = self.work(action.stage, action.micro_batch)
        target = self.placement.rank_of[work.stage - 1]
        if target == self.rank:
            return  # the previous stage takes them directly
        if work.input_grads is None:
            raise PipelineError(f"rank {self.module.global_rank}: {action} has no input gradient to send (its "
                                f"backward has not run)")
        self.messenger.send_grads(work.input_grads, work.stage, work.micro_batch, target, action)
        work.input_grads = None
        self._release(work)

    def _recv_output_grads(self, action: Action) -> None:
        """Post the receive and wait for it right here, as _recv_input does."""
        source = self.placement.rank_of[action.stage + 1]
        if source == self.rank:
            return
        work = self.work(action.stage, action.micro_batch)
        pending = self.posted.pop(action, None) or self._post_grads(action, work, source)
        work.output_grads = self.messenger.wait(pending)

    def _post_grads(self, action: Action, work: Work, source: int) -> Any:
        specs = [(tuple(t.shape), t.dtype) for t in floats(work.output)]
        return self.messenger.recv_grads(specs, action.stage + 1, action.micro_batch, source, action)

    def _post_ahead(self, index: int) -> None:
        """Post the next few receives now: gloo moves a message only once its receive is posted, so a
        receive posted early is filled while this rank computes. Posting never blocks; the wait stays where
        the program puts it. An activation receive is posted once its shapes are known (exchanged and
        cached), a gradient receive once its forward has run; at most LOOKAHEAD receives ahead."""
        while self.upcoming and self.upcoming[0] <= index:
            self.upcoming.pop(0)
        for position in self.upcoming[:LOOKAHEAD]:
            action = self.program[position]
            if action in self.posted:
                continue
            if action.kind is Kind.RECV_F:
                source = self.placement.rank_of[action.stage - 1]
                if source != self.rank and self.messenger.knows_shapes(action.stage - 1):
                    self.posted[action] = self.messenger.recv_activations(action.stage - 1, action.micro_batch,
                                                                          source, action)
            else:
                source = self.placement.rank_of[action.stage + 1]
                work = self.works.get((action.stage, action.micro_batch))
                if source != self.rank and work is not None and work.output is not None:
                    self.posted[action] = self._post_grads(action, work, source)

    def _release(self, work: Work) -> None:
        """Forget a (stage, micro-batch) once nothing more will read it."""
        key = (work.stage, work.micro_batch)
        if key not in self.works:
            return
        if self.training:
            if work.weights_done and work.input_grads is None:
                del self.works[key]
        elif work.output is None:
            del self.works[key]

    # ---------------------------------------------------------------------------------------- the step
    def _reduce_tied(self, action: Action | None) -> None:
        if self.tied_reduced:
            return
        self.module.allreduce_tied_weight_gradients()
        self.tied_reduced = True
        self._maybe_finish()

    def _reduce_grad(self, action: Action) -> None:
        self.reduced_stages.add(action.stage)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        # One reduction per rank, once every stage it holds is complete and tied gradients are summed.
        if not self.finished and self.tied_reduced and self.reduced_stages >= self.local_stages and self.sync:
            self.sync.finish_backward()
            self.finished = True

    def _step(self, action: Action | None) -> None:
        if self.sync is None:
            return
        self._reduce_tied(None)
        self.reduced_stages |= self.local_stages
        self._maybe_finish()
        self.sync.require_gradient_sync(True)
        self.applied = self.sync.step()


def _to_device(value: Any, device: torch.device) -> Any:
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _detached(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value
