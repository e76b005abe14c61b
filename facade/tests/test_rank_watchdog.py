"""A rank that stops answering (SIGSTOP) in a 2-rank job, plain or a 2-stage pipeline: the other rank ends
within rank_watchdog.timeout (and a heartbeat or two) with exit code 75 and a message naming the stopped rank
and what it was doing, instead of hanging for the process group's 30-minute timeout (as DeepSpeed does).

Rank 1 stops itself with SIGSTOP at a chosen point of its step, after a heartbeat has published what it
is doing; the rank runner then finds rank 0 gone with the watchdog's exit code and kills the stopped rank,
as a launcher does once a rank of its job fails."""

import os
import signal
import time

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model
from torch import nn

import dstrain
from dscomm import watchdog
from dscomm.testing import RankFailure, run_ranks
from dscomm.watchdog import STALL_EXIT_CODE
from dstrain.pipe import LayerSpec, PipelineModule

TIMEOUT = 3.0  # rank_watchdog.timeout of these jobs; heartbeats every 0.375 s


def _stop_here():
    time.sleep(1.0)  # a heartbeat or two publish what this rank is doing
    os.kill(os.getpid(), signal.SIGSTOP)


def plain_job(rank, world):
    model = make_model()
    engine, *_ = dstrain.initialize(model=model, config={**config(), "optimizer": ADAMW,
                                                         "rank_watchdog": {"timeout": TIMEOUT}})
    if rank == 1:
        model.register_full_backward_hook(lambda *_: _stop_here() if engine.global_steps == 2 else None)
    data = TokenDataset().data
    for step in range(40):
        engine.backward(engine(data[(step % 4) * 4:(step % 4 + 1) * 4]))
        engine.step()
    return "finished"


class _StopsOnStageOne(nn.Linear):
    def forward(self, x):
        if self.stop_at is not None and self.calls == self.stop_at:
            _stop_here()
        self.calls += 1
        return super().forward(x)


def pipe_job(rank, world):
    torch.manual_seed(0)
    specs = [LayerSpec(nn.Linear, 8, 8), nn.Tanh(), LayerSpec(_StopsOnStageOne, 8, 1)]
    model = PipelineModule(specs, num_stages=2, loss_fn=nn.functional.mse_loss)
    for layer in model.modules():
        if isinstance(layer, _StopsOnStageOne):
            layer.calls, layer.stop_at = 0, 6 if rank == 1 else None  # batch 2, micro-batch 2: action 1F2
    engine, *_ = dstrain.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "optimizer": ADAMW,
        "rank_watchdog": {"timeout": TIMEOUT}})

    def pairs():
        while True:
            yield torch.randn(2, 8), torch.randn(2, 1)

    data = pairs()
    for _ in range(20):
        engine.train_batch(data)
    return "finished"


@pytest.mark.parametrize(("job", "doing"), [
    (plain_job, "At its last heartbeat it was doing: engine backward of micro-step 3 (step 3)"),
    (pipe_job, "At its last heartbeat it was doing: pipeline action 1F2 on rank 1 (pipeline rank 1)"),
], ids=["plain", "pipeline"])
def test_a_stopped_rank_is_named_and_the_job_ends(capfd, job, doing):
    started = time.monotonic()
    with pytest.raises(RankFailure, match=rf"rank\(s\) \[0\] exited without a result \(exit codes "
                                          rf"\[{STALL_EXIT_CODE}\]\)"):
        run_ranks(job, 2, timeout=120, allow_missing=(1,))
    assert time.monotonic() - started < 60
    err = capfd.readouterr().err
    line = next((line for line in err.splitlines() if "stopped answering" in line), err[-3000:])
    assert "dscomm watchdog on rank 0: rank 1 (process " in line and "stopped (SIGSTOP)) stopped answering" in line
    assert doing in line, line


def default_and_disabled(rank, world):
    seen = []
    for section in ({"enabled": False}, {}, {"timeout": 30}):
        dstrain.initialize(model=make_model(), config={**config(), "optimizer": ADAMW, "rank_watchdog": section})
        active = watchdog.active()
        seen.append(None if active is None else active.timeout_s)
    watchdog.stop()
    return seen


def test_the_watchdog_is_on_by_default_with_its_timeout():
    # rank_watchdog.enabled false starts none; the default timeout names a stopped rank within 5 minutes.
    assert run_ranks(default_and_disabled, 2, timeout=180) == [[None, 240.0, 30.0]] * 2
