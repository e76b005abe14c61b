"""External parameters at stage 3: a module's forward reading another module's parameter (a tied output
projection, a parent reusing a child's weight) trains as the plain model does, found by itself or registered."""

import pytest
import torch
from torch import nn

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


class ParentReadsChild(nn.Module):
    """The parent's forward reuses its first child's weight after both children ran (DeepSpeed's ExtLinear)."""

    def __init__(self, dim=16):
        super().__init__()
        self.first = nn.Linear(dim, dim)
        self.second = nn.Linear(dim, dim)

    def forward(self, x):
        return nn.functional.linear(self.second(self.first(x)), self.first.weight).pow(2).mean()


class TiedProjection(nn.Module):
    """A small GPT-like model whose output projection is the embedding read outside the embedding's forward."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))

    def forward(self, tokens):
        hidden = self.block(self.embed(tokens[:, :-1]))
        logits = hidden @ self.embed.weight.t()
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class ReturnsItsBias(nn.Linear):
    def forward(self, x):
        return super().forward(x), self.bias


class PassesItOn(nn.Linear):
    """Returns what its child returned, the child's bias included, without reading it."""

    def __init__(self, dim=16):
        super().__init__(dim, dim)
        self.inner = ReturnsItsBias(dim, dim)

    def forward(self, x):
        return self.inner(super().forward(x))


class ReturnedParameter(nn.Module):
    """DeepSpeed's DanglingExt: a parameter returned up two levels and read by the container."""

    def __init__(self, dim=16):
        super().__init__()
        self.first = nn.Linear(dim, dim)
        self.middle = PassesItOn(dim)

    def forward(self, x):
        out, bias = self.middle(self.first(x))
        return (out + bias).pow(2).mean()


def _inputs(kind, step, rank):
    gen = torch.Generator().manual_seed(100 * step + rank)
    if kind == "tied":
        return torch.randint(0, 32, (4, 9), generator=gen)
    return torch.randn(4, 16, generator=gen)


def _model(kind):
    torch.manual_seed(0)
    return {"tied": TiedProjection, "parent": ParentReadsChild, "returned": ReturnedParameter}[kind]()


def train(rank, world, kind, zero_stage, register, steps=4):
    model = _model(kind)
    if register:
        dszero.register_external_parameter(model, {"tied": lambda: model.embed.weight, "parent": lambda: model.first.weight,
                                                   "returned": lambda: model.middle.inner.bias}[kind]())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if zero_stage is None:  # the reference: plain torch, gradients averaged over the ranks by hand
        losses = []
        for step in range(steps):
            loss = model(_inputs(kind, step, rank))
            loss.backward()
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses, {n: p.detach().clone() for n, p in model.named_parameters()}
    zero = dszero.ZeroOptimizer(model, optimizer, ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    losses = []
    for step in range(steps):
        loss = model(_inputs(kind, step, rank))
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
    with dszero.GatheredParameters(list(model.parameters())):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, weights, len(model._external_params), len(getattr(model, "middle", model)._external_params)


@pytest.mark.parametrize("kind", ["parent", "tied", "returned"])
@pytest.mark.parametrize("register", [False, True], ids=["found", "registered"])
def test_a_parameter_read_outside_its_module_trains_as_the_plain_model(kind, register):
    plain = run_ranks(train, 2, kind, None, False, timeout=120)
    zero3 = run_ranks(train, 2, kind, 3, register, timeout=120)
    for (ref_losses, ref_weights), (losses, weights, at_reader, at_middle) in zip(plain, zero3):
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for name, value in ref_weights.items():
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
        assert at_reader == 1  # the reader gathers the other module's parameter from then on
        if kind == "returned" and not register:
            assert at_middle == 0  # it only passed the bias on


def state_after_steps(rank, world):
    model = _model("parent")
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    for step in range(3):
        zero.backward(model(_inputs("parent", step, rank)))
        zero.step()
        zero.zero_grad()
    return model.first.weight.numel(), zero.reducer.forward_stack, len(zero.reducer.pinned)


def test_after_a_step_everything_is_released_and_nothing_is_left_on_the_stack():
    for released, stack, pinned in run_ranks(state_after_steps, 2, timeout=120):
        assert released == 0 and stack == [] and pinned == 0


def test_unregistering_a_parameter_never_registered_names_the_module():
    model = ParentReadsChild()
    with pytest.raises(ValueError, match="not registered with ParentReadsChild"):
        dszero.unregister_external_parameter(model, model.first.weight)
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Parameter"):
        dszero.register_external_parameter(model, torch.zeros(3))
