"""The engine trains as torch DDP does, at every ZeRO stage, with and without accumulation and clipping."""

import pytest
import torch
from engine_models import TokenDataset, config, make_model
from torch.nn.parallel import DistributedDataParallel as DDP

import dstrain
from dscomm.testing import run_ranks

STEPS = 6


def ddp_losses(rank, world, micro, gas, clip):
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sampler = torch.utils.data.DistributedSampler(TokenDataset(), num_replicas=world, rank=rank, seed=0)
    loader = iter(torch.utils.data.DataLoader(TokenDataset(), batch_size=micro, sampler=sampler))
    losses = []
    for _ in range(STEPS):
        total = 0.0
        for i in range(gas):
            loss = ddp(next(loader)) / gas
            if i < gas - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            total += loss.item()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, [p.detach().clone() for p in model.parameters()]


def engine_losses(rank, world, micro, gas, clip, stage, plain_backward=False, *, zero=None, managed=True):
    """The engine's losses and final weights; a client AdamW, or with `zero` the config's (and its zero keys)."""
    model = make_model()
    cfg = config(micro, gas, stage, gradient_clipping=clip, managed_gradient_accumulation=managed)
    if zero is None:
        client = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    else:
        client = None
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
        cfg["zero_optimization"] = {**cfg["zero_optimization"], **zero}
    engine, _, loader, _ = dstrain.initialize(model=model, optimizer=client, training_data=TokenDataset(), config=cfg)
    batches = iter(loader)
    losses = []
    for _ in range(STEPS):
        total = 0.0
        for _ in range(gas):
            loss = engine(next(batches))
            if plain_backward:
                loss.backward()
            elif managed:
                engine.backward(loss)
            else:  # the caller divides by the accumulation steps and steps once per boundary
                engine.backward(loss / gas)
            if managed:
                engine.step()
            total += loss.item() / gas
        if not managed:
            engine.step()
        losses.append(total)
    assert engine.global_steps == STEPS and engine.global_samples == STEPS * micro * gas * world
    with dstrain.zero.GatheredParameters(list(model.parameters())):
        weights = [p.detach().clone() for p in model.parameters()]
    return losses, weights


def _close(a, b):
    (la, wa), (lb, wb) = a, b
    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=1e-5, atol=1e-6)
    for x, y in zip(wa, wb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_matches_ddp_at_two_ranks(stage):
    expected = run_ranks(ddp_losses, 2, 4, 2, 0.5)
    got = run_ranks(engine_losses, 2, 4, 2, 0.5, stage)
    for rank in range(2):
        _close(got[rank], expected[rank])


def test_plain_loss_backward_matches_engine_backward():
    # Current DeepSpeed accepts loss.backward(); the engine scales it for accumulation all the same.
    with_engine = run_ranks(engine_losses, 2, 4, 2, 0.0, 2)
    plain = run_ranks(engine_losses, 2, 4, 2, 0.0, 2, True)
    _close(plain[0], with_engine[0])


def test_world_of_one_matches_a_plain_torch_loop():
    expected = run_ranks(ddp_losses, 1, 4, 1, 0.0)
    got = run_ranks(engine_losses, 1, 4, 1, 0.0, 0)
    _close(got[0], expected[0])


def micro_times_gas(rank, world, micro, gas):
    model = make_model()
    engine, _, _, _ = dstrain.initialize(model=model, config=config(micro, gas, 2, optimizer={
        "type": "AdamW", "params": {"lr": 1e-2}}))
    data = TokenDataset().data[:64]
    updates = []
    for step in range(3):
        batch = data[step * 16:(step + 1) * 16]
        for chunk in batch.chunk(gas):
            engine.backward(engine(chunk))
            engine.step()
        updates.append([p.detach().clone() for p in model.parameters()])
    return updates


def test_micro_2_by_gas_4_equals_micro_8_by_gas_1():
    (small,) = run_ranks(micro_times_gas, 1, 4, 4)
    (big,) = run_ranks(micro_times_gas, 1, 16, 1)
    for a, b in zip(small, big, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("zero", [
    {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
], ids=["zero2-cpu-offload", "zero3-cpu-offload"])
def test_offload_through_the_engine_matches_ddp(zero):
    expected = run_ranks(ddp_losses, 2, 4, 2, 0.5)
    got = run_ranks(engine_losses, 2, 4, 2, 0.5, 0, zero=zero)
    _close(got[0], expected[0])


def test_unmanaged_accumulation_steps_when_the_caller_says():
    expected = run_ranks(ddp_losses, 2, 4, 2, 0.5)
    got = run_ranks(engine_losses, 2, 4, 2, 0.5, 1, zero={}, managed=False)
    _close(got[0], expected[0])


def engine_built_under_init(rank, world, use_init):
    cfg = config(4, 1, 3, optimizer={"type": "AdamW", "params": {"lr": 1e-2}})
    if use_init:
        with dstrain.zero.Init(config_dict_or_path=cfg):
            model = make_model()
        assert all(p.numel() == 0 for p in model.parameters())  # nothing whole on any rank
    else:
        model = make_model()
    engine, _, loader, _ = dstrain.initialize(model=model, training_data=TokenDataset(), config=cfg)
    batches = iter(loader)
    losses = []
    for _ in range(STEPS):
        loss = engine(next(batches))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def test_zero_init_then_initialize_trains_as_without_init():
    assert run_ranks(engine_built_under_init, 2, True) == run_ranks(engine_built_under_init, 2, False)


def _no_sync(rank, world):
    from engine_models import ADAMW

    batches = [torch.randint(0, 48, (2, 13), generator=torch.Generator().manual_seed(10 * rank + i)) for i in (1, 2)]
    refused = []
    inside, *_ = dstrain.initialize(model=make_model(), config=config(micro=2, stage=1, optimizer=ADAMW))
    with inside.no_sync():
        for tokens in batches:  # two backward passes, reduced only at the step after the block
            inside.backward(inside(tokens))
        try:
            inside.step()
        except AssertionError as exc:
            refused.append(str(exc))
        try:
            with inside.no_sync():
                pass
        except AssertionError as exc:
            refused.append(str(exc))
    inside.step()
    summed, *_ = dstrain.initialize(model=make_model(), config=config(micro=2, stage=1, optimizer=ADAMW))
    summed.backward(sum(summed(tokens) for tokens in batches))  # the same gradients in one pass
    summed.step()
    stage2, *_ = dstrain.initialize(model=make_model(), config=config(micro=2, stage=2, optimizer=ADAMW))
    try:
        with stage2.no_sync():
            pass
    except AssertionError as exc:
        refused.append(str(exc))
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
               for a, b in zip(inside.module.parameters(), summed.module.parameters()))
    return same, refused


def test_no_sync_accumulates_locally_until_the_step_after_it_and_refuses_what_deepspeed_does():
    for same, refused in run_ranks(_no_sync, 2, timeout=120):
        assert same
        assert "illegal to call Engine.step() inside no_sync" in refused[0]
        assert "no_sync context manager reentry is unsupported" in refused[1]
        assert "incompatible with gradient partitioning logic of ZeRO stage 2" in refused[2]
