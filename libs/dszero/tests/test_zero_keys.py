"""zero_optimization keys that change what ZeroOptimizer does: ignore_unused_parameters (stage 2),
log_trace_cache_warnings (stage 3) and load_from_fp32_weights."""

import logging

import pytest
import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


class WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = make_model()
        self.spare = torch.nn.Linear(4, 4)  # never called

    def forward(self, tokens):
        return self.gpt(tokens)


def step_with_unused(rank, world, ignore):
    model = WithUnused()
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                ZeroConfig(stage=2, ignore_unused_parameters=ignore))
    zero.backward(loss_of(model, next(batches(1, 1, world, rank))[0]))
    try:
        zero.step()
    except dszero.ZeroError as exc:
        assert isinstance(exc, AssertionError)  # the type DeepSpeed raises here, which scripts catch
        return str(exc)
    return "stepped"


def test_ignore_unused_parameters_false_refuses_a_step_with_parameters_without_gradients():
    refused = run_ranks(step_with_unused, 2, False)
    assert all("zero_optimization.ignore_unused_parameters" in r and "spare.weight" in r for r in refused)
    assert run_ranks(step_with_unused, 2, True) == ["stepped", "stepped"]


class Reorderable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        gpt = make_model(layers=3)
        self.embed, self.blocks, self.head = gpt.embed, gpt.blocks, gpt.head
        self.reverse = False

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in reversed(self.blocks) if self.reverse else self.blocks:
            x = block(x)
        return self.head(x)


def trace_warnings(rank, world, log):
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("dszero").addHandler(handler)
    model = Reorderable()
    cfg = ZeroConfig(stage=3, stage3_param_persistence_threshold=0, log_trace_cache_warnings=log)
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg)
    for step, (tokens,) in enumerate(batches(3, 1, world, rank)):
        model.reverse = step == 2  # the third step leaves the order the first one recorded
        zero.backward(loss_of(model, tokens))
        zero.step()
        zero.zero_grad()
    return messages


def test_log_trace_cache_warnings_logs_when_the_module_order_leaves_the_recording():
    logged = run_ranks(trace_warnings, 2, True)
    assert len(logged[0]) == 1 and "trace cache" in logged[0][0] and "forward of blocks.2" in logged[0][0]
    assert logged[1] == []  # one rank speaks
    assert run_ranks(trace_warnings, 2, False) == [[], []]


def masters_after_load(rank, world, directory, from_fp32, stage):
    def build():
        model = make_model().to(torch.bfloat16)
        cfg = ZeroConfig(stage=stage, stage3_param_persistence_threshold=0, load_from_fp32_weights=from_fp32)
        return model, dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), cfg,
                                           precision="bf16")

    model, zero = build()
    for (tokens,) in batches(2, 1, world, rank):
        zero.backward(loss_of(model, tokens).float())
        zero.step()
        zero.zero_grad()
    saved = [dszero.safe_get_full_fp32_param(p).clone() for p in model.parameters()]
    zero.save(directory)
    model, zero = build()
    zero.load(directory)
    masters = [dszero.safe_get_full_fp32_param(p) for p in model.parameters()]
    with dszero.GatheredParameters(list(model.parameters())):
        weights = [p.detach().float().clone() for p in model.parameters()]
    return (all(torch.equal(m, s) for m, s in zip(masters, saved)),
            all(torch.equal(m, w) for m, w in zip(masters, weights)))


@pytest.mark.parametrize("stage", [1, 3])
def test_load_from_fp32_weights_false_starts_the_masters_from_the_16_bit_weights(tmp_path, stage):
    # bf16 training keeps fp32 masters apart from the bf16 weights, so the two starts differ.
    from_masters = run_ranks(masters_after_load, 2, str(tmp_path / "a"), True, stage)[0]
    from_weights = run_ranks(masters_after_load, 2, str(tmp_path / "b"), False, stage)[0]
    assert from_masters == (True, False)
    assert from_weights == (False, True)
