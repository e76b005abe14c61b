"""Every file of a checkpoint is covered by its manifest; a directory that is not a checkpoint of its own
is refused; node-local storage that turns out to be shared is coordinated instead of corrupted."""

import json
import struct

import pytest
import torch
from models import make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def train_and_save(rank, world, directory, steps=2):
    model = make_model()
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), ZeroConfig(stage=2))
    tokens = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(rank))
    for _ in range(steps):
        zero.backward(model(tokens[:, :-1]).logsumexp(-1).mean())
        zero.step()
        zero.zero_grad()
    zero.save(directory)
    return zero.skipped_steps


def load_into_fresh(rank, world, directory):
    model = make_model(seed=7)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), ZeroConfig(stage=2))
    try:
        zero.load(directory)
    except dszero.CheckpointError as exc:
        return f"refused: {exc}"
    return "loaded"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("integrity") / "ckpt"
    run_ranks(train_and_save, 2, directory, timeout=120)
    return directory


def _copy(saved, tmp_path):
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(saved, target)
    return target


def _flip_bit(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_complete_checkpoint_loads(saved, tmp_path):
    assert json.loads((saved / "manifest.json").read_text())["files"].keys() == {
        "zero_meta.json", "zero_shard_00000-of-00002.safetensors", "zero_shard_00001-of-00002.safetensors"}
    assert run_ranks(load_into_fresh, 1, _copy(saved, tmp_path), timeout=60) == ["loaded"]


def test_one_flipped_bit_in_the_metadata_is_refused(saved, tmp_path):
    directory = _copy(saved, tmp_path)
    meta = directory / "zero_meta.json"
    _flip_bit(meta, meta.read_text().index('"skipped_steps"') + 18)
    message = run_ranks(load_into_fresh, 1, directory, timeout=60)[0]
    assert message.startswith("refused") and "zero_meta.json: checksum does not match" in message


def test_removing_the_data_checksums_from_a_shard_is_refused(saved, tmp_path):
    directory = _copy(saved, tmp_path)
    shard = directory / "zero_shard_00001-of-00002.safetensors"
    data = shard.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    header["__metadata__"] = {k: v for k, v in header["__metadata__"].items() if "crc" not in k}
    text = json.dumps(header).encode().ljust(size)  # same header length: the file's layout is unchanged
    shard.write_bytes(data[:8] + text + data[8 + size:])
    message = run_ranks(load_into_fresh, 1, directory, timeout=60)[0]
    assert "zero_shard_00001-of-00002.safetensors: checksum does not match" in message


@pytest.mark.parametrize("damage", ["extra file", "missing manifest", "edited manifest", "truncated shard"])
def test_damage_around_the_files_is_refused(saved, tmp_path, damage):
    directory = _copy(saved, tmp_path)
    manifest = directory / "manifest.json"
    if damage == "extra file":
        (directory / "zero_shard_00002-of-00002.safetensors").write_bytes(b"x")
        expected = "not listed ['zero_shard_00002-of-00002.safetensors']"
    elif damage == "missing manifest":
        manifest.unlink()
        expected = "no manifest.json"
    elif damage == "edited manifest":
        content = json.loads(manifest.read_text())
        content["files"]["zero_meta.json"]["size"] += 1
        manifest.write_text(json.dumps(content))
        expected = "own checksum does not match"
    else:
        shard = directory / "zero_shard_00000-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:-8])
        expected = "size does not match"
    message = run_ranks(load_into_fresh, 1, directory, timeout=60)[0]
    assert message.startswith("refused") and expected in message, message


@pytest.mark.parametrize("where", [".", "..", "/", "data"])
def test_a_directory_that_is_not_a_checkpoint_of_its_own_is_refused(tmp_path, monkeypatch, where):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("user data")
    monkeypatch.chdir(tmp_path / "data")
    target = str(tmp_path / "data") if where == "data" else where
    expected = "is not a ZeRO checkpoint" if where == "data" else "not a checkpoint directory of its own"
    with pytest.raises(Exception, match=expected):
        run_ranks(train_and_save, 1, target, 1, timeout=60)
    assert (tmp_path / "data" / "keep.txt").read_text() == "user data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def node_local_save(rank, world, directory):
    model = make_model()
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), ZeroConfig(stage=1))
    zero.backward(model(torch.randint(0, 64, (2, 16))).logsumexp(-1).mean())
    zero.step()
    zero.save(directory, node_local=True)
    fresh = make_model(seed=3)
    other = dszero.ZeroOptimizer(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2), ZeroConfig(stage=1))
    other.load(directory)
    return all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_node_local_storage_on_a_shared_directory_is_coordinated(tmp_path):
    # Two one-rank "nodes" (each its own local rank 0) that both write into one directory.
    assert run_ranks(node_local_save, 2, tmp_path / "shared", timeout=120) == [True, True]
    names = sorted(p.name for p in (tmp_path / "shared").iterdir())
    assert names == ["manifest.json", "zero_meta.json", "zero_shard_00000-of-00002.safetensors",
                     "zero_shard_00001-of-00002.safetensors"]
    assert not any(p.name.startswith(".dszero-writer") for p in tmp_path.iterdir())
