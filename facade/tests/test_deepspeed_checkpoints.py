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


def resume_every_case(rank, world):
    # One group of ranks for every fixture, a fresh engine per case: the ranks start once, not once per case.
    return {case: resume(rank, world, case, str(FIXTURES / case)) for case in ZERO_CASES}


@pytest.mark.parametrize("world", [2, 1])
def test_deepspeed_checkpoints_continue_with_deepspeeds_losses(world):
    """Each ZeRO fixture (stages 0-3, fp32 and bf16, saved at 2 ranks) loads at `world` ranks."""
    results = run_ranks(resume_every_case, world, timeout=300)[0]
    for case in ZERO_CASES:
        record = expected(case)
        (path, client, steps, samples, _lr), losses = results[case]
        assert Path(path) == FIXTURES / case / record["tag"], case
        assert client == im.CLIENT_STATE, case
        assert (steps, samples) == (im.STEPS_BEFORE_SAVE, im.STEPS_BEFORE_SAVE * im.GLOBAL_BATCH), case
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(record["losses_after_save"]), rtol=rtol(case),
                                   atol=0, msg=lambda m, case=case: f"{case}: {m}")


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


def refused_load(model: torch.nn.Module, world: int, directory: str) -> tuple[str, bool]:
    """The error of loading `directory` into a fresh engine, and whether the engine is untouched after it."""
    engine, *_ = dstrain.initialize(model=model, config=im.config(2, dp_size=world))
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    with pytest.raises(CheckpointLoadError) as info:
        engine.load_checkpoint(directory)
    after = engine.module.state_dict()
    return str(info.value), all(torch.equal(before[k], after[k]) for k in before) and engine.global_steps == 0


def bad_loads(rank, world, missing_root, truncated_root):
    return {"missing": refused_load(im.make_lm(seed=123), world, missing_root),
            "truncated": refused_load(im.make_lm(seed=123), world, truncated_root),
            "other shape": refused_load(im.LM(d=16), world, str(FIXTURES / "zero2_fp32"))}  # every width differs


def test_a_missing_or_truncated_file_or_another_shape_is_named_and_nothing_is_loaded(tmp_path):
    missing_root, truncated_root = tmp_path / "missing", tmp_path / "truncated"
    shutil.copytree(FIXTURES / "zero2_fp32", missing_root)
    shutil.copytree(FIXTURES / "zero2_fp32", truncated_root)
    missing = missing_root / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    missing.unlink()
    victim = truncated_root / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    results = run_ranks(bad_loads, 2, str(missing_root), str(truncated_root), timeout=180)[0]
    message, untouched = results["missing"]
    assert str(missing) in message and untouched
    message, untouched = results["truncated"]
    assert str(victim) in message and untouched
    message, untouched = results["other shape"]
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
    out = convert_zero_checkpoint_to_fp32_state_dict(FIXTURES / case, tmp_path, safe_serialization=True)
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


def partial_loads(rank, world, directory):
    return [partial_load(rank, world, directory, options)
            for options in ({"load_module_only": True}, {"load_optimizer_states": False})]


def test_module_only_and_fresh_optimizer_loads_of_a_deepspeed_checkpoint():
    module_only, fresh_optimizer = run_ranks(partial_loads, 2, str(FIXTURES / "zero2_fp32"), timeout=180)[0]
    client, steps, same, moments = module_only
    assert client == im.CLIENT_STATE and steps == 0 and same and moments == 0  # weights only, as DeepSpeed
    client, steps, same, moments = fresh_optimizer
    assert steps == im.STEPS_BEFORE_SAVE and same and moments == 0  # counters and scheduler, fresh moments


def load_client(rank, world, directory):
    engine, *_ = dstrain.initialize(model=im.make_lm(seed=123), config=im.config(1, dtype="fp32", dp_size=world))
    return engine.load_checkpoint(directory)[1]


def test_a_megatron_clients_iteration_and_universal_info_come_back_in_the_client_state(tmp_path):
    """Megatron-DeepSpeed saves its step as `iteration` and its merge patterns as `universal_checkpoint_info` in the
    client state; DeepSpeed's load_checkpoint returns both, and so must dstrain's (they were taken for DeepSpeed's)."""
    from dstrain.checkpoint.deepspeed.unpickler import load_pickle

    directory = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "zero1_fp32", directory)
    states_file = directory / expected("zero1_fp32")["tag"] / "mp_rank_00_model_states.pt"
    states = load_pickle(states_file)
    megatron = {"iteration": 30, "universal_checkpoint_info": {"vocabulary_parameter_patterns": ["word_embeddings"]}}
    rewritten = states_file.with_suffix(".new")  # beside it, then moved over: the old file's tensors are mapped
    torch.save({**states, **megatron}, rewritten)
    rewritten.replace(states_file)
    client = run_ranks(load_client, 1, str(directory), timeout=180)[0]
    assert client == {**im.CLIENT_STATE, **megatron}
