"""Point-to-point between the pipeline ranks of one replica: single tagged isend/irecv, posted in the
order the schedule says (batched isend/irecv can hang on gloo), every wait with a timeout whose error
names this rank, the action and the peer.

Activations travel with a header of their shapes and dtypes on a channel's first message (and on every
message with dynamic_shape), so receive buffers match exactly; gradients need none, as they have the
shapes of the activations the receiving stage sent.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch

import dscomm

from ..errors import PipelineError
from .wire import HEADER_SLOTS, MAX_TENSORS, Spec, decode_header, encode_header, specs_of, tag


@dataclass
class Pending:
    """Receives posted for one message; `wait()` gives the filled tensors."""

    tensors: list[torch.Tensor]
    is_tuple: bool
    handles: list[Any]
    action: Any
    peer: int  # pipeline rank
    what: str


class Messenger:
    """`pipe_ranks[r]`: the global rank of pipeline rank r in this rank's replica."""

    def __init__(self, pipe_ranks: list[int], pipe_rank: int, timeout: datetime.timedelta, dynamic_shape: bool,
                 device: torch.device | None = None):
        self.pipe_ranks = list(pipe_ranks)
        self.pipe_rank = pipe_rank
        self.global_rank = self.pipe_ranks[pipe_rank]
        self.timeout = timeout
        self.dynamic_shape = dynamic_shape
        self.device = device or torch.device("cpu")
        self._sent: dict[tuple[str, int], tuple[list[Spec], bool]] = {}
        self._received: dict[tuple[str, int], tuple[list[Spec], bool]] = {}
        self._sends: list[tuple[Any, Any, int, str]] = []

    def reset_shapes(self) -> None:
        """Forget the exchanged shapes: the next message of each channel carries its header again."""
        self._sent.clear()
        self._received.clear()

    def knows_shapes(self, sender_stage: int) -> bool:
        """Whether an activation receive from `sender_stage` can be posted without waiting for a header."""
        return not self.dynamic_shape and ("F", sender_stage) in self._received

    # ---------------------------------------------------------------------------------------- activations
    def send_activations(self, tensors: list[torch.Tensor], is_tuple: bool, stage: int, micro_batch: int,
                         peer: int, action: Any) -> None:
        specs = specs_of(tensors)
        channel = ("F", stage)
        if self.dynamic_shape or channel not in self._sent:
            self._post_send(encode_header(specs, is_tuple).to(self.device), tag("H", stage, micro_batch, MAX_TENSORS),
                            peer, action, "the activation header")
            self._sent[channel] = (specs, is_tuple)
        elif self._sent[channel] != (specs, is_tuple):
            raise PipelineError(
                f"{self._me(action)}: stage {stage}'s output for micro-batch {micro_batch} is "
                f"{_describe(specs, is_tuple)}, but the shapes exchanged with pipeline rank {peer} were "
                f"{_describe(*self._sent[channel])}; shapes are exchanged once unless the PipelineModule has "
                f"dynamic_shape=True (or call engine.reset_activation_shape() on every rank when they change)")
        for slot, tensor in enumerate(tensors):
            self._post_send(tensor.detach().contiguous(), tag("F", stage, micro_batch, slot), peer, action,
                            f"activation {slot}")

    def recv_activations(self, sender_stage: int, micro_batch: int, peer: int, action: Any) -> Pending:
        channel = ("F", sender_stage)
        if self.dynamic_shape or channel not in self._received:
            header = torch.zeros(HEADER_SLOTS, dtype=torch.int64, device=self.device)
            handle = self._irecv(header, tag("H", sender_stage, micro_batch, MAX_TENSORS), peer, action)
            self._wait(handle, action, peer, "the activation header")
            self._received[channel] = decode_header(header.cpu(), self._me(action))
        specs, is_tuple = self._received[channel]
        tensors = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
        handles = [self._irecv(t, tag("F", sender_stage, micro_batch, slot), peer, action)
                   for slot, t in enumerate(tensors)]
        return Pending(tensors, is_tuple, handles, action, peer, "activations")

    # ---------------------------------------------------------------------------------------- gradients
    def send_grads(self, grads: list[torch.Tensor], stage: int, micro_batch: int, peer: int, action: Any) -> None:
        for slot, grad in enumerate(grads):
            self._post_send(grad.detach().contiguous(), tag("B", stage, micro_batch, slot), peer, action,
                            f"gradient {slot}")

    def recv_grads(self, specs: list[Spec], sender_stage: int, micro_batch: int, peer: int, action: Any) -> Pending:
        tensors = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
        handles = [self._irecv(t, tag("B", sender_stage, micro_batch, slot), peer, action)
                   for slot, t in enumerate(tensors)]
        return Pending(tensors, False, handles, action, peer, "gradients")

    # ---------------------------------------------------------------------------------------- waiting
    def wait(self, pending: Pending) -> list[torch.Tensor]:
        for handle in pending.handles:
            self._wait(handle, pending.action, pending.peer, pending.what)
        pending.handles = []
        return pending.tensors

    def wait_sends(self) -> None:
        """Wait for every send posted so far (the peer received it)."""
        sends, self._sends = self._sends, []
        for handle, action, peer, what in sends:
            self._wait(handle, action, peer, what)

    def _post_send(self, tensor: torch.Tensor, message_tag: int, peer: int, action: Any, what: str) -> None:
        try:
            handle = dscomm.isend(tensor, self.pipe_ranks[peer], tag=message_tag, log_name="pipe_send")
        except dscomm.CommError as exc:
            raise self._failure(action, peer, what, exc) from None
        self._sends.append((handle, action, peer, what))

    def _irecv(self, tensor: torch.Tensor, message_tag: int, peer: int, action: Any) -> Any:
        try:
            return dscomm.irecv(tensor, self.pipe_ranks[peer], tag=message_tag, log_name="pipe_recv")
        except dscomm.CommError as exc:
            raise self._failure(action, peer, "a receive", exc) from None

    def _wait(self, handle: Any, action: Any, peer: int, what: str) -> None:
        try:
            handle.wait(self.timeout)
        except (dscomm.CommError, RuntimeError) as exc:
            raise self._failure(action, peer, what, exc) from None

    def _failure(self, action: Any, peer: int, what: str, exc: BaseException) -> PipelineError:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return PipelineError(f"{self._me(action)} gave up waiting for {what} with pipeline rank {peer} (global rank "
                             f"{self.pipe_ranks[peer]}) within {self.timeout.total_seconds():g} s: that stage died, "
                             f"hung or runs another schedule ({reason})")

    def _me(self, action: Any) -> str:
        return f"rank {self.global_rank} (pipeline rank {self.pipe_rank}), action {action}"


def _describe(specs: list[Spec], is_tuple: bool) -> str:
    parts = [f"{str(dtype).removeprefix('torch.')}{list(shape)}" for shape, dtype in specs]
    return f"({', '.join(parts)})" if is_tuple else parts[0]
