"""MoE checkpoints: one file per (layer, global expert) with DeepSpeed's names, reloaded at another
ep_size with the optimizer state (training continues as if uninterrupted), a Mixture-of-Students
teacher loaded from them, expert loads reported to the monitors, and experts broadcast only within
their expert-data-parallel group."""

import csv

import torch
from moe_models import BATCH, SEQ, TinyMoELM, batch, distinct_experts, reference, seed_gate

import dsaio
import dstrain
from dscomm.testing import run_ranks

WORLD, SAVED_AT, STEPS = 2, 2, 4


def config(stage, directory=None):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}}
    if directory is not None:
        cfg["csv_monitor"] = {"enabled": True, "output_path": directory, "job_name": "moe"}
    return cfg


def engine_at(ep, stage, directory=None):
    model = TinyMoELM(ep_size=ep)
    engine, *_ = dstrain.initialize(model=model, config=config(stage, directory))
    return model, engine


def steps(model, engine, rank, first, last, report=False):
    losses = []
    for step in range(first, last):
        seed_gate(model, step, rank)
        loss = engine(batch(step, rank))
        engine.backward(loss)
        engine.step()
        if report:
            dstrain.moe.report_expert_counts(engine)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / WORLD)
    return losses


def ranks(rank, world, root):
    # Experts differ per rank before initialize: at ep 1 both ranks hold the same experts and rank 0's win;
    # at ep 2 each rank's experts are its own and no broadcast over the data group may overwrite them.
    broadcast = {}
    for ep in (1, 2):
        model = TinyMoELM(ep_size=ep)
        with torch.no_grad():
            for param in model.moe.deepspeed_moe.experts.parameters():
                param.fill_(float(rank + 1))
        engine, *_ = dstrain.initialize(model=model, config=config(1))
        broadcast[ep] = sorted({float(v) for p in model.moe.deepspeed_moe.experts.parameters() for v in p.unique()})
        engine.destroy()

    model, engine = engine_at(2, 2, f"{root}/logs")
    with torch.no_grad():
        distinct_experts(model)
        engine.optimizer.masters_from_module()
    before = steps(model, engine, rank, 0, SAVED_AT, report=True)
    engine.save_checkpoint(f"{root}/ckpt", tag="moe")
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine.destroy()

    model, engine = engine_at(1, 1)  # another ep_size and stage
    engine.load_checkpoint(f"{root}/ckpt")
    after = steps(model, engine, rank, SAVED_AT, STEPS)
    engine.destroy()

    teacher = dstrain.moe.load_teacher(TinyMoELM(ep_size=1), f"{root}/ckpt")
    teacher_weights = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    return broadcast, before + after, saved, teacher_weights, all(not p.requires_grad for p in teacher.parameters())


def test_moe_checkpoints_reload_at_another_ep_size_and_feed_a_teacher(tmp_path):
    want_losses, _, _ = reference(WORLD, STEPS, clip=0.0)
    results = run_ranks(ranks, WORLD, str(tmp_path), timeout=240)
    files = sorted(p.name for p in (tmp_path / "ckpt" / "moe").iterdir() if p.name.startswith("layer_"))
    assert files == [f"layer_0_expert_{e}_mp_rank_00_model_states.safetensors" for e in range(4)]
    module_state = dsaio.load_state_dict(tmp_path / "ckpt" / "moe" / "model_states.safetensors")
    assert not any("deepspeed_experts" in name for name in module_state)  # experts live in their own files
    for rank, (broadcast, losses, saved, teacher, frozen) in enumerate(results):
        assert broadcast[1] == [1.0], (rank, broadcast)  # ep 1: rank 0's experts everywhere
        assert broadcast[2] == [float(rank + 1)], (rank, broadcast)  # ep 2: each rank keeps its own
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6,
                                   msg=f"rank {rank}: saved at ep 2 after step {SAVED_AT}, resumed at ep 1")
        for name, weight in saved.items():  # the teacher holds every expert; this rank saved two of them
            torch.testing.assert_close(teacher[name], weight, msg=name)
        assert frozen
    events = tmp_path / "logs" / "moe"
    counts = [list(csv.reader(next(events.rglob(f"Train_Samples_moe_layer_0_expert_{e}_tokens.csv"))
                              .read_text().splitlines()))[1:] for e in range(4)]
    for step in range(SAVED_AT):  # every token of both ranks went to one expert (top-1)
        assert sum(float(rows[step][1]) for rows in counts) == WORLD * BATCH * SEQ
    assert [int(float(rows[0][0])) for rows in counts] == [WORLD * BATCH] * 4  # x-axis: samples so far
