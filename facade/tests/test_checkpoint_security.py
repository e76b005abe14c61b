"""Checkpoints are hostile input: nothing in them runs code, tags and `latest` stay one directory under the
root, every file is verified before use, and a refused save loses nothing that was saved before."""

import argparse
import os
import pickle
import warnings
from pathlib import Path

import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dsaio
import dstrain
from dscomm.testing import run_ranks
from dszero.checkpoint import write_manifest


def _engine(stage=0, seed=0, **extra):
    engine, *_ = dstrain.initialize(model=make_model(seed), config=config(stage=stage, optimizer=ADAMW, **extra))
    return engine


def _step(engine, n=1):
    data = TokenDataset().data
    for i in range(n):
        engine.backward(engine(data[i * 4:(i + 1) * 4]))
        engine.step()


def _error(call) -> str:
    try:
        call()
    except (dstrain.DstrainError, dstrain.CheckpointLoadError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


class _Payload:
    """Unpickling this touches a file: proof that code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def crafted_pickle(rank, world, root, marker):
    engine = _engine()
    _step(engine)
    engine.save_checkpoint(root, tag="t")
    tag_dir = Path(root) / "t"
    # What the old code accepted: a tensor marked as pickled, with valid checksums and a valid manifest.
    payload = torch.frombuffer(bytearray(pickle.dumps({"client_state": _Payload(marker)})), dtype=torch.uint8)
    dsaio.save_state_dict({"pickled": payload}, tag_dir / "engine_common.safetensors")
    os.unlink(tag_dir / "manifest.json")
    write_manifest(tag_dir)
    return _error(lambda: _engine().load_checkpoint(root, tag="t"))


def test_a_crafted_pickle_in_a_checkpoint_never_runs(tmp_path):
    marker = tmp_path / "payload-ran"
    message = run_ranks(crafted_pickle, 1, str(tmp_path / "ckpt"), str(marker))[0]
    assert not marker.exists()
    assert message.startswith("CheckpointLoadError") and "not a dstrain engine file" in message


class _OwnObject:
    pass


def client_states(rank, world, root):
    engine = _engine()
    _step(engine)
    engine.save_checkpoint(root, tag="kept", client_state={"epoch": 1})
    refused = _error(lambda: engine.save_checkpoint(root, tag="bad", client_state={"obj": [_OwnObject()]}))
    args = argparse.Namespace(lr=0.5, layers=[2, 3])
    engine.save_checkpoint(root, tag="args", client_state={"args": args, "seen": {1, 2}})
    _, client = _engine().load_checkpoint(root, tag="args")
    _, kept = _engine().load_checkpoint(root, tag="kept")
    return refused, client, kept, sorted(p.name for p in Path(root).iterdir())


def test_client_state_outside_the_declared_types_is_refused_at_save_on_every_rank(tmp_path):
    for refused, client, kept, names in run_ranks(client_states, 2, str(tmp_path), timeout=120):
        assert refused.startswith("DstrainError") and "'client_state.obj.0'" in refused
        assert "_OwnObject" in refused and "nothing was saved" in refused
        assert client == {"args": argparse.Namespace(lr=0.5, layers=[2, 3]), "seen": {1, 2}}
        assert kept == {"epoch": 1}
        assert names == ["args", "kept", "latest"]


BAD_TAGS = ["", ".", "..", "../outside", "/abs/path", "a/b", "a\\b", "x\ny", "nul\0", " padded", "padded ",
            "latest", "t.partial", "t.old", "t.tmp", "x" * 201]


def bad_tags(rank, world, root, outside):
    engine = _engine()
    _step(engine)
    engine.save_checkpoint(root, tag="good")
    messages = [_error(lambda t=tag: engine.save_checkpoint(root, tag=t)) for tag in BAD_TAGS]
    messages += [_error(lambda t=tag: engine.load_checkpoint(root, tag=t)) for tag in BAD_TAGS]
    messages.append(_error(lambda: engine.save_checkpoint(root, tag=outside)))
    _, _ = _engine().load_checkpoint(root)  # the earlier checkpoint is still there
    return messages, (Path(root) / "latest").read_text()


def test_tags_are_one_directory_name_and_refused_otherwise(tmp_path):
    root = tmp_path / "ckpt"
    messages, latest = run_ranks(bad_tags, 1, str(root), str(tmp_path / "elsewhere"))[0]
    for tag, message in zip(BAD_TAGS * 2 + ["abs"], messages):
        assert "a tag is one directory name" in message, (tag, message)
    assert latest == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in root.iterdir()) == ["good", "latest"]


def not_a_checkpoint(rank, world, root):
    engine = _engine()
    _step(engine)
    (Path(root) / "mine").mkdir(parents=True)
    (Path(root) / "mine" / "notes.txt").write_text("user data")
    return _error(lambda: engine.save_checkpoint(root, tag="mine"))


def test_a_tag_directory_that_is_not_a_checkpoint_is_never_replaced(tmp_path):
    message = run_ranks(not_a_checkpoint, 1, str(tmp_path))[0]
    assert "is not a dstrain checkpoint" in message
    assert (tmp_path / "mine" / "notes.txt").read_text() == "user data"


LATEST_CONTENTS = {"absolute": b"/etc", "parent": b"../elsewhere", "not utf-8": b"\xff\xfe\x00tag",
                   "huge": b"a" * 300_000, "separator": b"good/zero", "empty": b"  \n"}


def hostile_latest(rank, world, root, outside):
    engine = _engine()
    _step(engine)
    engine.save_checkpoint(root, tag="good")
    Path(outside).mkdir()
    os.symlink(outside, Path(root) / "linked")
    results = {}
    for name, content in LATEST_CONTENTS.items():
        (Path(root) / "latest").write_bytes(content)
        results[name] = _error(lambda: _engine().load_checkpoint(root))
    (Path(root) / "latest").write_bytes(b"linked")
    results["link out of the root"] = _error(lambda: _engine().load_checkpoint(root))
    return results


def test_latest_is_untrusted(tmp_path):
    results = run_ranks(hostile_latest, 1, str(tmp_path / "ckpt"), str(tmp_path / "outside"))[0]
    for name, message in results.items():
        assert message.startswith("CheckpointLoadError"), (name, message)
    assert "larger than any tag" in results["huge"] and "not UTF-8" in results["not utf-8"]
    assert "a tag is one directory name" in results["absolute"] and "outside" in results["link out of the root"]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x04
    path.write_bytes(bytes(data))


def tampered(rank, world, root):
    engine = _engine(stage=1, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}})
    _step(engine, 2)
    results = {}
    for what in ("zero meta", "rank state header", "removed file", "manifest"):
        tag = what.replace(" ", "-")
        engine.save_checkpoint(root, tag=tag)
        directory = Path(root) / tag
        if what == "zero meta":
            meta = directory / "zero" / "zero_meta.json"
            _flip(meta, meta.read_text().index('"lr"') + 7)
        elif what == "rank state header":
            _flip(directory / "engine_rank00000.safetensors", 20)
        elif what == "removed file":
            (directory / "model_states.safetensors").unlink()
        else:
            manifest = directory / "manifest.json"
            manifest.write_text(manifest.read_text().replace('"size": ', '"size": 1', 1))
        results[what] = _error(lambda t=tag: _engine(stage=1).load_checkpoint(root, tag=t))
    return results


def test_every_file_is_verified_before_loading(tmp_path):
    results = run_ranks(tampered, 1, str(tmp_path))[0]
    assert "zero_meta.json: checksum does not match" in results["zero meta"]
    assert "engine_rank00000.safetensors: checksum does not match" in results["rank state header"]
    assert "missing ['model_states.safetensors']" in results["removed file"]
    assert "own checksum does not match" in results["manifest"]
    assert all(m.startswith("CheckpointLoadError") for m in results.values()), results


def shared_node_local(rank, world, root):
    # Two one-rank "nodes", each its own local rank 0, whose "node-local" directory is the same one.
    engine = _engine(stage=1, checkpoint={"use_node_local_storage": True})
    _step(engine, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.save_checkpoint(root)
    fresh = _engine(stage=1, seed=3, checkpoint={"use_node_local_storage": True})
    path, _ = fresh.load_checkpoint(root)
    return path, fresh.global_steps


def test_node_local_storage_that_is_shared_still_saves_and_loads(tmp_path):
    for path, steps in run_ranks(shared_node_local, 2, str(tmp_path), timeout=120):
        assert path.endswith("global_step2") and steps == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step2", "latest", "zero_to_fp32.py"]
