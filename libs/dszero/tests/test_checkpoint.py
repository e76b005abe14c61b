"""Sharded checkpoints: reshard across world sizes, survive a crash mid-save, consolidate to fp32."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch
from models import loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4


def global_batch(step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 64, (GLOBAL_BATCH, 17), generator=gen)


def make_zero(stage, seed=0):
    model = make_model(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    return model, dszero.ZeroOptimizer(model, opt, ZeroConfig(stage=stage, reduce_bucket_size=3000,
                                                           stage3_param_persistence_threshold=0))


def full_weights(model):
    with dszero.GatheredParameters(model.parameters()):
        return {k: v.clone() for k, v in model.state_dict().items()}


def train_step(model, zero, step, rank, world):
    tokens = global_batch(step).chunk(world)[rank]
    loss = loss_of(model, tokens)
    zero.backward(loss)
    zero.step()
    zero.zero_grad()
    mean = torch.tensor([loss.item()])
    torch.distributed.all_reduce(mean)
    return mean.item() / world


def save_after_three(rank, world, stage, directory):
    model, zero = make_zero(stage)
    for step in range(3):
        train_step(model, zero, step, rank, world)
    zero.save(directory)
    fourth = train_step(model, zero, 3, rank, world)
    return fourth, full_weights(model)


def load_and_continue(rank, world, stage, directory):
    model, zero = make_zero(stage, seed=99)  # different starting weights: the checkpoint must replace them
    zero.load(directory)
    fourth = train_step(model, zero, 3, rank, world)
    return fourth, full_weights(model)


@pytest.mark.parametrize(("stage", "saved", "loaded"), [(2, 2, 1), (2, 2, 4), (1, 4, 2), (2, 2, 3), (0, 2, 2),
                                                     (3, 2, 1), (3, 2, 4), (3, 4, 2)])
def test_reshard_gives_the_same_next_step(tmp_path, stage, saved, loaded):
    directory = tmp_path / "ckpt"
    reference = run_ranks(save_after_three, saved, stage, directory, timeout=120)[0]
    resumed = run_ranks(load_and_continue, loaded, stage, directory, timeout=120)[0]
    assert resumed[0] == pytest.approx(reference[0], rel=1e-5)
    for name, value in reference[1].items():
        torch.testing.assert_close(resumed[1][name], value, rtol=1e-5, atol=1e-5, msg=name)


def test_zero_to_fp32_equals_the_unsharded_weights(tmp_path):
    directory = tmp_path / "ckpt"

    def save_weights(rank, world):
        model, zero = make_zero(2)
        for step in range(2):
            train_step(model, zero, step, rank, world)
        zero.save(directory)
        return {k: v.clone() for k, v in model.state_dict().items()}

    weights = run_ranks(save_weights, 2, timeout=120)[0]
    consolidated = dszero.get_fp32_state_dict_from_zero_checkpoint(directory)
    assert set(consolidated) == set(weights)
    for name, value in weights.items():
        assert torch.equal(consolidated[name], value), name
    out = tmp_path / "model.safetensors"
    cli = subprocess.run([sys.executable, "-m", "dszero.checkpoint.zero_to_fp32", str(directory), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    from safetensors.torch import load_file

    loaded = load_file(out)
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())


def killed_while_saving(rank, world, directory):
    model, zero = make_zero(2)
    train_step(model, zero, 0, rank, world)
    zero.save(directory)                      # a complete checkpoint
    train_step(model, zero, 1, rank, world)
    if rank == 1:
        os._exit(0)                           # dies before the second save
    with contextlib.suppress(Exception):  # the peer is gone; what matters is what is on disk
        zero.save(directory)
    return "done"


def test_a_rank_killed_during_save_leaves_the_last_checkpoint_loadable(tmp_path):
    directory = tmp_path / "ckpt"
    run_ranks(killed_while_saving, 2, directory, timeout=120, pg_timeout=10, allow_missing=(1,))
    state = dszero.get_fp32_state_dict_from_zero_checkpoint(directory)
    assert "head.weight" in state
    resumed = run_ranks(load_and_continue, 2, 2, directory, timeout=120)
    assert resumed[0][0] > 0


def wrong_model(rank, world, directory):
    model = make_model(d=48)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), ZeroConfig(stage=2))
    try:
        zero.load(directory)
    except dszero.CheckpointError as exc:
        return str(exc)
    return "loaded"


def test_mismatched_model_and_missing_shard_are_named(tmp_path):
    directory = tmp_path / "ckpt"
    run_ranks(save_after_three, 2, 2, directory, timeout=120)
    message = run_ranks(wrong_model, 1, directory, timeout=60)[0]
    assert "does not match this model" in message and "shapes differ" in message
    (directory / "zero_shard_00001-of-00002.safetensors").unlink()
    with pytest.raises(dszero.CheckpointError, match=r"missing \['zero_shard_00001-of-00002\.safetensors'\]"):
        dszero.get_fp32_state_dict_from_zero_checkpoint(directory)
    with pytest.raises(dszero.CheckpointError, match="no ZeRO checkpoint"):
        dszero.get_fp32_state_dict_from_zero_checkpoint(tmp_path / "nothing")


def save_with_records(rank, world, directory):
    model, zero = make_zero(1)
    train_step(model, zero, 0, rank, world)
    with dszero.checkpoint.recording({"run": "r1", "rank": rank}):
        zero.save(directory)  # the optimizer's own save takes no record: the block gives it
    return rank


def test_every_shard_and_the_meta_carry_the_callers_record(tmp_path):
    import json

    import dsaio

    run_ranks(save_with_records, 2, str(tmp_path / "ck"))
    for rank in range(2):
        metadata = dsaio.read_metadata(tmp_path / "ck" / f"zero_shard_{rank:05d}-of-00002.safetensors")
        assert json.loads(metadata[dszero.checkpoint.RECORD]) == {"run": "r1", "rank": rank}
    assert dszero.checkpoint.read_meta(tmp_path / "ck")[dszero.checkpoint.RECORD] == {"run": "r1", "rank": 0}


def _reload_groups_state_and_files(rank, world, stage, directory):
    model, zero = make_zero(stage)
    for step in range(2):
        train_step(model, zero, step, rank, world)
    zero.save(directory)
    saved_state = {k: {kk: vv.clone() for kk, vv in v.items()} for k, v in zip(range(99), zero.state.values())}
    model, zero = make_zero(stage, seed=7)
    assert isinstance(zero.param_groups[0]["betas"], tuple)
    zero.load(directory)
    loaded_state = dict(zip(range(99), zero.state.values()))
    return (zero.param_groups[0]["betas"], zero.state is zero.optimizer.state, saved_state, loaded_state,
            dszero.checkpoint.shard_path(zero, directory), sorted(p.name for p in directory.iterdir()))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_load_keeps_tuple_hyperparameters_and_the_state_reads_back(tmp_path, stage):
    directory = tmp_path / "ckpt"
    results = run_ranks(_reload_groups_state_and_files, 2, stage, directory, timeout=120)
    for rank, (betas, same, saved_state, loaded_state, shard, files) in enumerate(results):
        assert betas == (0.9, 0.999) and isinstance(betas, tuple)  # not the list its JSON record holds
        assert same and saved_state and saved_state.keys() == loaded_state.keys()
        for key, kinds in saved_state.items():  # `state`: the wrapped optimizer's (Adam's moments, the step)
            assert kinds.keys() == loaded_state[key].keys()
            for kind, tensor in kinds.items():
                torch.testing.assert_close(loaded_state[key][kind], tensor, rtol=0, atol=0)
        assert shard.parent == directory and shard.name in files  # the file that holds this rank's state
        assert shard.name == f"zero_shard_{rank if stage else 0:05d}-of-00002.safetensors"
