"""Stage 3 with frozen parameters built under dszero.Init (LoRA, partial fine-tuning): they stay partitioned,
are gathered for forward and backward, released after their module's backward, and never reduced."""

import torch
from models import batches
from torch import nn

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

VOCAB, D, LAYERS, STEPS = 64, 32, 3, 4


class LoRALinear(nn.Module):
    """A frozen base Linear plus a trainable low-rank adapter (PEFT's shape)."""

    def __init__(self, d_in: int, d_out: int, rank: int = 4):
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.lora_a = nn.Linear(d_in, rank, bias=False)
        self.lora_b = nn.Linear(rank, d_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))


class LoRANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([LoRALinear(D, D) for _ in range(LAYERS)])
        self.head = LoRALinear(D, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = x + torch.nn.functional.gelu(layer(x))
        return self.head(x)


def build(init: bool) -> LoRANet:
    torch.manual_seed(0)
    if init:
        with dszero.Init():
            model = LoRANet()
    else:
        model = LoRANet()
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)  # the embedding and every base Linear frozen
    return model


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def frozen_units_gathered(zero, model):
    """Names of the base Linears whose frozen units are gathered now."""
    return [name for name, sub in model.named_modules()
            if name.endswith("base") and any(p._dszero_unit.gathered for p in sub.parameters())]


def train_zero3(rank, world):
    model = build(init=True)
    frozen_before = {}
    with dszero.GatheredParameters(list(model.parameters())):
        frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    # Every parameter given to the optimizer, the frozen ones included (Hugging Face's Trainer filters them; a
    # plain script may not): the optimizer trains only those that require grad.
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    stage3 = zero.reducer
    seen = {}  # layer name -> frozen bases gathered when its backward starts, per step

    def record(name):
        def hook(module, grad_output):
            seen.setdefault(name, []).append((frozen_units_gathered(zero, model), stage3.live_numel()))
        return hook

    for name, sub in model.named_modules():
        if isinstance(sub, LoRALinear):
            sub.register_full_backward_pre_hook(record(name))
    losses, between = [], []
    for step in batches(STEPS, 1, world, rank):
        loss = loss_of(model, step[0])
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
        between.append((sum(p.numel() for p in model.parameters()), stage3.live_numel(),
                        frozen_units_gathered(zero, model)))
    shard_numel = sum(u.shard_numel for u in stage3.frozen)
    with dszero.GatheredParameters(list(model.parameters())):
        state = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, state, frozen_before, seen, between, shard_numel, len(zero.groups), len(stage3.frozen)


def train_plain():
    model = build(init=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for step in batches(STEPS, 1, 1, 0, micro_batch=8):  # both ranks' batches at once
        loss = loss_of(model, step[0])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_frozen_init_parameters_stay_partitioned_and_train_like_plain_torch():
    results = run_ranks(train_zero3, 2, timeout=120)
    reference_losses, reference = train_plain()
    frozen_numel = sum(p.numel() for n, p in reference.items() if "lora_" not in n)
    mean_losses = [sum(r[0][i] for r in results) / len(results) for i in range(STEPS)]
    torch.testing.assert_close(torch.tensor(mean_losses), torch.tensor(reference_losses), rtol=1e-5, atol=1e-6)
    order = [f"layers.{i}" for i in range(LAYERS)] + ["head"]
    for _losses, state, frozen_before, seen, between, shard_numel, trained_units, frozen_units in results:
        assert trained_units == 2 * (LAYERS + 1) and frozen_units == 2 * (LAYERS + 1) + 1
        for name, value in reference.items():  # the adapters trained as without ZeRO
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6)
        for name, value in frozen_before.items():  # the frozen weights untouched
            assert torch.equal(state[name], value), name
        # Between steps: nothing gathered, each rank holds only its shard of the frozen weights.
        for held, live, gathered in between:
            assert held == 0 and live == 0 and gathered == []
        assert shard_numel <= frozen_numel // 2 + 8 * frozen_units
        # During backward (last layer first): when a layer's backward starts, the frozen bases of the layers after
        # it have been released already (their backward is done), on every step.
        for position, name in enumerate(order):
            later = {f"{other}.base" for other in order[position + 1:]}
            assert len(seen[name]) == STEPS
            for gathered, _live in seen[name]:
                assert not later & set(gathered), (name, gathered)
        # The frozen weights are most of this model: at the first layer's backward far from all are gathered.
        first_live = max(live for _, live in seen["layers.0"])
        assert first_live < frozen_numel // 2


def late_unfrozen(rank, world):
    model = build(init=True)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]),
                                ZeroConfig(stage=3))
    model.layers[1].base.weight.requires_grad_(True)  # trainable after the engine was built: out of scope
    tokens = next(batches(1, 1, world, rank))[0]
    try:
        zero.backward(loss_of(model, tokens))
    except dszero.ZeroError as exc:
        return str(exc)
    return "no error"


def test_a_gradient_for_a_frozen_init_parameter_is_refused_by_name():
    message = run_ranks(late_unfrozen, 1, timeout=60)[0]
    assert "layers.1.base.weight" in message and "not trained" in message


def held_forward(rank, world):
    model = build(init=True)
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    tokens = next(batches(1, 1, world, rank))[0]
    with torch.no_grad():
        hooked = model(tokens[:, :-1])
    zero.empty_partition_cache()
    with dszero.HeldParameters(model.parameters()), torch.no_grad():
        held = model(tokens[:, :-1])
    released = all(p.numel() == 0 for p in model.parameters() if not p.requires_grad)  # adapters: persistent
    return torch.equal(hooked, held) and released


def test_held_parameters_gather_the_frozen_units_for_generation():
    for same in run_ranks(held_forward, 2, timeout=60):
        assert same


def small_frozen_units_persist(rank, world):
    model = build(init=True)
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=100))
    for step in batches(2, 1, world, rank):
        zero.backward(loss_of(model, step[0]))
        zero.step()
        zero.zero_grad()
    report = zero.memory_report()
    shards = sum(u.home.nbytes for u in zero.groups + zero.reducer.frozen)
    return {n: p.numel() for n, p in model.named_parameters() if not p.requires_grad}, report["parameters"] == shards


def test_frozen_init_units_under_the_persistence_threshold_stay_gathered():
    for held, reported in run_ranks(small_frozen_units_persist, 2, timeout=60):
        assert reported  # memory_report's parameters: the frozen units' shards too
        # The base biases (32 and 64 elements) whole on every rank, as DeepSpeed keeps small parameters; the
        # weights and the embedding partitioned.
        assert all(numel > 0 for n, numel in held.items() if n.endswith("bias"))
        assert all(numel == 0 for n, numel in held.items() if not n.endswith("bias"))
