"""load_module_only, tag validation, latest, interrupted saves, save_16bit_model, and clear load errors."""

import warnings
from pathlib import Path

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import RankFailure, run_ranks


def _engine(stage=0, seed=0, **extra):
    model = make_model(seed)
    engine, *_ = dstrain.initialize(model=model, config=config(stage=stage, optimizer=ADAMW, **extra))
    return engine


def _step(engine, n=2):
    data = TokenDataset().data
    for i in range(n):
        engine.backward(engine(data[i * 4:(i + 1) * 4]))
        engine.step()


def save_then_load_module_only(rank, world, directory, stage, extra):
    engine = _engine(stage, **extra)
    _step(engine, 3)
    engine.save_checkpoint(directory, tag="t1")
    with dstrain.zero.GatheredParameters(list(engine.module.parameters())):
        saved = [p.detach().clone() for p in engine.module.parameters()]
    fresh = _engine(stage, seed=5, **extra)
    path, client = fresh.load_checkpoint(directory, load_module_only=True)
    _step(fresh, 1)  # the next update starts from the loaded weights (bf16: its fp32 masters were reset)
    with dstrain.zero.GatheredParameters(list(fresh.module.parameters())):
        moved = max((a - b).abs().max().item() for a, b in zip(saved, fresh.module.parameters()))
    assert moved < 0.1, moved  # one small step away, not back at the fresh model's own weights
    fresh = _engine(stage, seed=5, **extra)
    path, client = fresh.load_checkpoint(directory, load_module_only=True)
    with dstrain.zero.GatheredParameters(list(fresh.module.parameters())):
        loaded = [p.detach().clone() for p in fresh.module.parameters()]
    state_empty = all(len(v) == 0 for v in fresh.basic_optimizer.state.values())
    return path.endswith("t1"), client, fresh.global_steps, state_empty, all(torch.equal(a, b) for a, b in
                                                                             zip(saved, loaded))


@pytest.mark.parametrize(("stage", "extra"), [(0, {}), (3, {}), (1, {"bf16": {"enabled": True}})],
                         ids=["stage0", "stage3", "stage1-bf16"])
def test_load_module_only_takes_weights_and_nothing_else(tmp_path, stage, extra):
    for ok, client, steps, state_empty, same in run_ranks(save_then_load_module_only, 2, str(tmp_path), stage,
                                                          extra):
        assert ok and client == {} and steps == 0 and state_empty and same


def skipped_steps_without_optimizer_states(rank, world, directory, stage, reshard):
    fp16 = {"fp16": {"enabled": True, "initial_scale_power": 24, "hysteresis": 1}}  # 2**24 overflows: skips
    engine = _engine(stage, **fp16)
    _step(engine, 3)
    engine.save_checkpoint(directory, tag="t1")
    counters = (engine.global_steps, engine.skipped_steps)
    # Another stage is another layout: the checkpoint is read whole and cut for this run.
    fresh = _engine(1 if reshard else stage, seed=5, **fp16)
    fresh.load_checkpoint(directory, load_optimizer_states=False)
    state_empty = all(len(v) == 0 for v in fresh.basic_optimizer.state.values())
    module_only = _engine(stage, seed=5, **fp16)
    module_only.load_checkpoint(directory, load_module_only=True)
    return counters, (fresh.global_steps, fresh.skipped_steps), state_empty, module_only.skipped_steps


@pytest.mark.parametrize(("stage", "reshard"), [(2, False), (0, False), (2, True)])
def test_skipped_steps_come_back_with_global_steps_without_optimizer_states(tmp_path, stage, reshard):
    for saved, loaded, state_empty, module_only in run_ranks(skipped_steps_without_optimizer_states, 2,
                                                             str(tmp_path), stage, reshard):
        assert saved[1] >= 1 and loaded == saved  # DeepSpeed's engine counters: both come back, states or not
        assert state_empty and module_only == 0  # the moments stay out; load_module_only takes no counter


def different_tags(rank, world, directory, mode):
    engine = _engine(checkpoint={"tag_validation": mode})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.save_checkpoint(directory, tag=f"rank{rank}")
    except dstrain.DstrainError as exc:
        return "error" + (" assert" if isinstance(exc, AssertionError) else ""), str(exc)
    return "warned", " ".join(str(w.message) for w in caught)


def test_tag_validation_fail_and_warn(tmp_path):
    for outcome, message in run_ranks(different_tags, 2, str(tmp_path / "f"), "Fail"):
        assert outcome == "error assert" and "tag" in message  # an AssertionError too, as DeepSpeed raises
    for outcome, message in run_ranks(different_tags, 2, str(tmp_path / "w"), "Warn"):
        assert outcome == "warned" and "differs" in message


def load_errors(rank, world, directory):
    engine = _engine()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nothing = engine.load_checkpoint(directory)
    messages = [str(w.message) for w in caught]
    _step(engine)
    engine.save_checkpoint(directory, tag="good")
    (Path(directory) / "broken.partial").mkdir()
    errors = []
    for tag in ("missing", "broken"):
        try:
            engine.load_checkpoint(directory, tag=tag)
        except dstrain.CheckpointLoadError as exc:
            errors.append(str(exc))
    for save_dir in ("", None):  # DeepSpeed's ValueError; "" is not the working directory
        try:
            engine.save_checkpoint(save_dir)
        except ValueError as exc:
            errors.append(str(exc))
    return nothing, messages, errors, (Path(directory) / "latest").read_text()


def test_missing_checkpoints_and_no_directory_fail_clearly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nothing, messages, errors, latest = run_ranks(load_errors, 1, str(tmp_path / "checkpoints"))[0]
    assert nothing == (None, None) and any("latest" in m for m in messages)
    assert "does not exist" in errors[0] and "good" in errors[0]
    assert "did not finish" in errors[1]
    assert errors[2:] == [f"save_checkpoint(save_dir={d!r}): save_dir must name the checkpoint's directory"
                          for d in ("", None)]
    assert latest == "good" and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


def killed_mid_save(rank, world, directory):
    engine = _engine(stage=2)
    _step(engine)
    engine.save_checkpoint(directory, tag="first")
    _step(engine)
    if rank == 1:
        import os

        os._exit(3)  # dies before joining the second save
    engine.save_checkpoint(directory, tag="second")


def load_after_crash(rank, world, directory):
    engine = _engine(stage=2)
    path, _ = engine.load_checkpoint(directory)
    return path, engine.global_steps


def test_a_rank_dying_mid_save_leaves_the_last_checkpoint_loadable(tmp_path):
    with pytest.raises(RankFailure):
        run_ranks(killed_mid_save, 2, str(tmp_path), timeout=30, pg_timeout=5)
    path, steps = run_ranks(load_after_crash, 2, str(tmp_path))[0]
    assert path.endswith("first") and steps == 2


def save_16bit(rank, world, directory, stage, gather):
    engine = _engine(stage, bf16={"enabled": True},
                     zero_optimization={"stage": stage, "stage3_gather_16bit_weights_on_model_save": gather,
                                        "stage3_param_persistence_threshold": 0})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        return engine.save_16bit_model(directory, "model.bin")


@pytest.mark.parametrize(("stage", "gather", "written"), [(0, False, True), (3, True, True), (3, False, False)])
def test_save_16bit_model(tmp_path, stage, gather, written):
    assert run_ranks(save_16bit, 2, str(tmp_path), stage, gather) == [written] * 2
    assert (tmp_path / "model.bin").exists() == written
    if written:
        state = torch.load(tmp_path / "model.bin")
        reference = make_model().state_dict()
        assert set(state) == set(reference) and all(v.dtype == torch.bfloat16 for v in state.values())


def node_local_round_trip(rank, world, root):
    # Two "nodes" of one rank each, each with its own disk: nothing is shared between the directories.
    directory = f"{root}/node{rank}"
    engine = _engine(stage=1, checkpoint={"use_node_local_storage": True})
    _step(engine, 2)
    engine.save_checkpoint(directory)
    before = [p.detach().clone() for p in engine.module.parameters()]
    fresh = _engine(stage=1, seed=3, checkpoint={"use_node_local_storage": True})
    path, _ = fresh.load_checkpoint(directory)
    return path, fresh.global_steps, all(torch.equal(a, b) for a, b in zip(before, fresh.module.parameters()))


def test_node_local_storage_needs_no_shared_file_system(tmp_path):
    for rank, (path, steps, same) in enumerate(run_ranks(node_local_round_trip, 2, str(tmp_path))):
        assert path.endswith(f"node{rank}/global_step2") and steps == 2 and same
    assert not (tmp_path / "node1" / "global_step2" / "zero" / "zero_shard_00000-of-00002.safetensors").exists()
