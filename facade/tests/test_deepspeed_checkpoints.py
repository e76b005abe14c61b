"""DeepSpeed's own checkpoints (fixtures/deepspeed/, written by DeepSpeed 0.19.8 with
fixtures/make_deepspeed_fixtures.py) load through the unchanged `engine.load_checkpoint(dir)` line, at
the data-parallel size they were saved at and at another, and training continues with the losses
DeepSpeed itself recorded after the save."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import interop_models as im
import pytest
import torch

import dstrain
from dscomm.testing import run_ranks
from dstrain.errors import CheckpointLoadError

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed"
ZERO_CASES = ["zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32", "zero1_bf16", "zero2_bf16", "zero3_bf16"]
STAGE = {case: int(case[4]) for case in ZERO_CASES}


def expected(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())


def rtol(case: str) -> float:
    # fp32: the same arithmetic as DeepSpeed's. bf16: the same steps, rounded in bf16 in a different order.
    return 1e-5 if "fp32" in case else 2e-2


def train(engine, world: int, rank: int, first: int, count: int) -> list[float]:
    accumulation = engine.gradient_accumulation_steps()
    losses = []
    for step in range(first, first + count):
        total = 0.0
        for batch in im.micro_batches(step, rank, world, accumulation):
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        mean = torch.tensor(total / accumulation)
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
    return losses


def resume(rank, world, case, directory):
    stage = STAGE[case]
    cfg = im.config(stage, dtype="bf16" if "bf16" in case else "fp32", dp_size=world)
    model = im.make_lm(seed=123)  # other weights than DeepSpeed started from: everything must come from the files
    engine, *_ = dstrain.initialize(model=model, config=cfg)
    path, client = engine.load_checkpoint(directory)
    state = (path, client, engine.global_steps, engine.global_samples, engine.get_lr())
    return state, train(engine, world, rank, im.STEPS_BEFORE_SAVE, im.STEPS_AFTER_SAVE)


@pytest.mark.parametrize("world", [2, 1])
@pytest.mark.parametrize("case", ZERO_CASES)
def test_deepspeed_checkpoint_continues_with_deepspeeds_losses(case, world):
    record = expected(case)
    (path, client, steps, samples, _lr), losses = run_ranks(resume, world, case, str(FIXTURES / case), timeout=180)[0]
    assert Path(path) == FIXTURES / case / record["tag"]
    assert client == im.CLIENT_STATE
    assert (steps, samples) == (im.STEPS_BEFORE_SAVE, im.STEPS_BEFORE_SAVE * im.GLOBAL_BATCH)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(record["losses_after_save"]), rtol=rtol(case), atol=0)


def pipeline_resume(rank, world, stages, directory):
    from dstrain.pipe import PipelineModule

    torch.manual_seed(rank + 50)
    module = PipelineModule(im.pipeline_layers(), num_stages=stages, loss_fn=im.lm_loss, partition_method="uniform")
    dp = world // stages
    cfg = im.config(1, dp_size=dp, pipeline=True)
    engine, *_ = dstrain.initialize(model=module, config=cfg)
    _, client = engine.load_checkpoint(directory)
    steps = engine.global_steps
    dp_rank = rank % dp if stages == 1 else 0
    losses = []
    for step in range(im.STEPS_BEFORE_SAVE, im.STEPS_BEFORE_SAVE + im.STEPS_AFTER_SAVE):
        micro = im.micro_batches(step, dp_rank, dp, engine.gradient_accumulation_steps())
        loss = engine.train_batch(iter([(b[:, :-1], b[:, 1:]) for b in micro]))
        mean = torch.tensor(float(loss))
        if stages == 1:
            torch.distributed.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
    return client, steps, losses


@pytest.mark.parametrize(("world", "stages"), [(2, 2), (1, 1), (2, 1)])
def test_deepspeed_pipeline_checkpoint_loads_at_any_stage_count(world, stages):
    case = "pipe2_zero1_fp32"
    record = expected(case)
    client, steps, losses = run_ranks(pipeline_resume, world, stages, str(FIXTURES / case), timeout=180)[-1]
    assert client == im.CLIENT_STATE and steps == im.STEPS_BEFORE_SAVE
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(record["losses_after_save"]), rtol=1e-5, atol=0)


def load_only(rank, world, directory, stage):
    engine, *_ = dstrain.initialize(model=im.make_lm(seed=123), config=im.config(stage, dp_size=world))
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    try:
        engine.load_checkpoint(directory)
    except CheckpointLoadError as exc:
        after = engine.module.state_dict()
        untouched = all(torch.equal(before[k], after[k]) for k in before) and engine.global_steps == 0
        return str(exc), untouched
    return None, False


def test_a_missing_rank_file_is_named_and_nothing_is_loaded(tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "zero2_fp32", root)
    missing = root / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    missing.unlink()
    message, untouched = run_ranks(load_only, 1, str(root), 2, timeout=120)[0]
    assert str(missing) in message and untouched


def test_a_truncated_file_is_named_and_nothing_is_loaded(tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "zero2_fp32", root)
    victim = root / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    message, untouched = run_ranks(load_only, 2, str(root), 2, timeout=120)[0]
    assert str(victim) in message and untouched


def test_a_model_of_another_shape_is_refused_naming_the_parameter(tmp_path):
    def other_model(rank, world, directory):
        model = im.LM(d=16)  # every width differs
        engine, *_ = dstrain.initialize(model=model, config=im.config(2, dp_size=world))
        before = {k: v.clone() for k, v in engine.module.state_dict().items()}
        with pytest.raises(CheckpointLoadError) as info:
            engine.load_checkpoint(directory)
        return str(info.value), all(torch.equal(before[k], v) for k, v in engine.module.state_dict().items())

    message, untouched = run_ranks(other_model, 1, str(FIXTURES / "zero2_fp32"), timeout=120)[0]
    assert "embed.weight is (48, 24)" in message and "(48, 16)" in message and untouched


@pytest.mark.parametrize("case", ["zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32", "zero3_bf16",
                                  "pipe2_zero1_fp32"])
def test_zero_to_fp32_reads_deepspeeds_checkpoints(case, tmp_path):
    from dstrain.utils.zero_to_fp32 import (
        convert_zero_checkpoint_to_fp32_state_dict,
        get_fp32_state_dict_from_zero_checkpoint,
        load_state_dict_from_zero_checkpoint,
    )

    state = get_fp32_state_dict_from_zero_checkpoint(FIXTURES / case)  # the root: its `latest` names the tag
    # DeepSpeed's own ds_to_universal wrote the zero2_fp32 run's fp32 masters into the universal fixture.
    universal = FIXTURES / "universal" / "global_step3_universal" / "zero"
    names = {p.name for p in universal.iterdir() if p.is_dir()}
    if case.startswith("pipe"):
        assert len(state) == len(names) and all(v.dtype == torch.float32 for v in state.values())
        return
    assert set(state) == names and all(v.dtype == torch.float32 for v in state.values())
    from dstrain.checkpoint.deepspeed.unpickler import load_pickle

    tolerance = {"rtol": 0, "atol": 0} if case == "zero2_fp32" else {"rtol": 1e-5, "atol": 1e-6}
    if "bf16" in case:
        tolerance = {"rtol": 0.05, "atol": 5e-3}  # another run, in bf16
    for name in names:
        torch.testing.assert_close(state[name], load_pickle(universal / name / "fp32.pt")["param"], **tolerance)
    out = convert_zero_checkpoint_to_fp32_state_dict(FIXTURES / case, tmp_path)
    assert out == tmp_path / "model.safetensors"
    model = load_state_dict_from_zero_checkpoint(im.LM(), FIXTURES / case)
    assert torch.equal(model.head.weight, state["head.weight"])


def moe_resume(rank, world, directory):
    from dstrain.moe.layer import MoE

    model = im.make_moe_lm(MoE, ep_size=world, seed=5)
    engine, *_ = dstrain.initialize(model=model, config=im.config(2, dp_size=world))
    _, client = engine.load_checkpoint(directory)
    steps = engine.global_steps
    return client, steps, train(engine, world, rank, im.STEPS_BEFORE_SAVE, im.STEPS_AFTER_SAVE)


@pytest.mark.parametrize("world", [2, 1])
def test_deepspeed_moe_checkpoint_loads_at_another_expert_parallel_size(world):
    """DeepSpeed numbers a rank's experts 0..n-1 in its ZeRO files; they load by global id, at ep_size 2 (as
    saved) and 1 (all four experts on one rank)."""
    case = "moe_ep2_zero2_fp32"
    client, steps, losses = run_ranks(moe_resume, world, str(FIXTURES / case), timeout=180)[0]
    assert client == im.CLIENT_STATE and steps == im.STEPS_BEFORE_SAVE
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected(case)["losses_after_save"]), rtol=1e-5,
                               atol=0)


def partial_load(rank, world, directory, options):
    from dstrain.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    engine, *_ = dstrain.initialize(model=im.make_lm(seed=123), config=im.config(2, dp_size=world))
    _, client = engine.load_checkpoint(directory, **options)
    masters = get_fp32_state_dict_from_zero_checkpoint(directory)
    same_weights = all(torch.equal(p.detach(), masters[n]) for n, p in engine.module.named_parameters())
    moments = [s for s in engine.optimizer.optimizer.state.values() if "exp_avg" in s]
    return client, engine.global_steps, same_weights, len(moments)


def test_module_only_and_fresh_optimizer_loads_of_a_deepspeed_checkpoint():
    directory = str(FIXTURES / "zero2_fp32")
    client, steps, same, moments = run_ranks(partial_load, 2, directory, {"load_module_only": True},
                                                timeout=120)[0]
    assert client == im.CLIENT_STATE and steps == 0 and same and moments == 0  # weights only, as DeepSpeed
    client, steps, same, moments = run_ranks(partial_load, 2, directory, {"load_optimizer_states": False},
                                                 timeout=120)[0]
    assert steps == im.STEPS_BEFORE_SAVE and same and moments == 0  # counters and scheduler, fresh moments
