"""dszero.Init: parameters are partitioned as modules are built, and training afterwards is unchanged."""

import pytest
import torch
from models import Block, batches, loss_of, make_model
from torch import nn

import dszero
from dscomm.testing import run_ranks
from dsconfig import OffloadParamConfig, ZeroConfig

STEPS = 5


class Tower(nn.Module):
    """The test transformer's shape, recording after each block how many whole parameter elements exist."""

    def __init__(self, layers: int, d: int, whole_after_each_block: list):
        super().__init__()
        self.embed = nn.Embedding(64, d)
        blocks = []
        for _ in range(layers):
            blocks.append(Block(d, 4))
            whole_after_each_block.append(sum(p.numel() for m in (self.embed, *blocks) for p in m.parameters()))
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(d, 64)


def build(rank, world, use_init):
    whole = []
    torch.manual_seed(0)
    if use_init:
        with dszero.Init():
            model = Tower(4, 32, whole)
    else:
        model = Tower(4, 32, whole)
    full = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    held = sum(p.numel() for p in model.parameters())
    shards = sum(p._dszero_unit.shard_numel for p in model.parameters() if hasattr(p, "_dszero_unit"))
    largest_module = max(sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters(recurse=False)) for m in model.modules()
                         if list(m.parameters(recurse=False)))
    return whole, full, held, shards, largest_module


def test_the_whole_model_never_sits_on_one_rank():
    for whole, full, held, shards, largest in run_ranks(build, 2, True, timeout=60):
        # After each block, every parameter built so far is partitioned: nothing whole is left over,
        # so the peak is one module under construction plus the shards of the rest.
        assert whole == [0, 0, 0, 0]
        assert held == 0
        assert shards < 0.55 * full
        assert largest + shards < full
    plain = run_ranks(build, 1, False, timeout=60)[0]
    assert plain[0][-1] > 0.9 * plain[1]  # without Init the same probe sees the model whole


def train(rank, world, use_init, cfg, bias=False):
    torch.manual_seed(0)
    if use_init:
        with dszero.Init(config=cfg):
            model = make_model()
    else:
        model = make_model()
    if bias:  # nn.MultiheadAttention writes its child projection's bias inside its own __init__
        torch.manual_seed(1)
        with dszero.Init(enabled=use_init):
            model.blocks[0].attn = nn.MultiheadAttention(32, 4, batch_first=True, bias=True)
    with dszero.GatheredParameters(list(model.parameters())):
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), cfg)
    losses = []
    for (tokens,) in batches(STEPS, 1, world, rank):
        loss = loss_of(model, tokens)
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
    return initial, losses


@pytest.mark.parametrize("offload", [False, True], ids=["device", "param-offload-cpu"])
def test_training_after_init_equals_training_without(offload):
    cfg = ZeroConfig(stage=3, stage3_param_persistence_threshold=0,
                     offload_param=OffloadParamConfig(device="cpu") if offload else None)

    def both(rank, world):
        return train(rank, world, False, cfg, bias=True), train(rank, world, True, cfg, bias=True)

    for (plain_init, plain_losses), (init_init, init_losses) in run_ranks(both, 2, timeout=120):
        for name, value in plain_init.items():
            torch.testing.assert_close(init_init[name], value, rtol=0, atol=0, msg=name)
        assert init_losses == pytest.approx(plain_losses, rel=1e-6)


def partition_existing(rank, world):
    model = make_model()
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    dszero.Init(module=model)
    held = sum(p.numel() for p in model.parameters())
    with dszero.GatheredParameters(model.parameters()):
        same = all(torch.equal(model.state_dict()[k], v) for k, v in reference.items())
    with dszero.GatheredParameters(model.head.bias, modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                model.head.bias.fill_(3.0)
    with dszero.GatheredParameters(model.head.bias):
        bias = model.head.bias.detach().clone()
    return held, same, bias


def test_init_partitions_a_built_module_and_gathered_parameters_work_on_it():
    for held, same, bias in run_ranks(partition_existing, 2, timeout=60):
        assert held == 0 and same
        assert torch.all(bias == 3.0)  # rank 0's write reached rank 1's shard


def misuse(rank, world):
    with dszero.Init():
        model = make_model()
    try:
        dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), ZeroConfig(stage=2))
    except dszero.ZeroError as exc:
        return str(exc)
    return "no error"


def test_init_misuse_is_named():
    assert "stage must be 3" in run_ranks(misuse, 1, timeout=60)[0]


def only_the_head_trained(rank, world, freeze):
    """The optimizer gets only the head's parameters; the rest, built under Init, stays in Init's shards."""
    with dszero.Init():
        model = make_model()
    if freeze:
        for name, param in model.named_parameters():
            param.requires_grad_(name.startswith("head."))
    with dszero.GatheredParameters(list(model.parameters())):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.head.parameters(), lr=0.5),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    held = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("head."))
    try:
        for step in batches(2, 1, world, rank):
            zero.backward(loss_of(model, step[0]))
            zero.step()
            zero.zero_grad()
    except dszero.ZeroError as exc:
        return str(exc)
    with dszero.GatheredParameters(list(model.parameters())):
        changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    return held, changed


def test_init_parameters_the_optimizer_does_not_train_stay_partitioned():
    # Frozen (LoRA's base weights): they train nothing and stay in their shards; only the head changes.
    for held, changed in run_ranks(only_the_head_trained, 2, True, timeout=60):
        assert held == 0 and changed == {"head.weight", "head.bias"}
    # Left trainable but not given to the optimizer: the first gradient one of them receives is refused by name.
    message = run_ranks(only_the_head_trained, 1, False, timeout=60)[0]
    assert "not trained by the ZeRO stage-3 optimizer" in message and "blocks." in message


def disabled(rank, world):
    with dszero.Init(enabled=False):
        model = make_model()
    return sum(p.numel() for p in model.parameters()), nn.Linear.__init__ is nn.Linear.__dict__["__init__"]


def test_disabled_init_changes_nothing_and_the_classes_are_restored():
    held, _ = run_ranks(disabled, 1, timeout=60)[0]
    assert held == sum(p.numel() for p in make_model().parameters())
    assert not getattr(nn.Linear.__init__, "_dszero_wrapped", False)
