"""A re-blessed checkpoint never loads the wrong state: every file records its save, step and place, and
loading checks them whatever the manifest says. Each case tampers as a repairer would (moving files, then
regenerating the manifest so every checksum agrees) and must be refused naming the file and the mismatch:
a `latest` rolled back over newer ZeRO shards, swapped tp_00/tp_01 folders, swapped pipeline layer files
of one shape, a foreign expert file under load_module_only."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks
from dszero.checkpoint import write_manifest


def _refusal(call) -> str:
    try:
        call()
    except dstrain.CheckpointLoadError as exc:
        return str(exc)
    return "loaded"


def _rename_swap(a: Path, b: Path) -> None:
    a.rename(a.with_name("swap"))
    b.rename(a)
    a.with_name("swap").rename(b)


def _reblessed(tag_dir: Path) -> None:
    """What a repairer does after moving files: a fresh manifest, so every checksum agrees again."""
    os.unlink(tag_dir / "manifest.json")
    write_manifest(tag_dir)


def rolled_back(rank, world, root):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(stage=1, optimizer=ADAMW))
    data = TokenDataset().data
    for step in range(4):
        engine.backward(engine(data[step * 4:(step + 1) * 4]))
        engine.step()
        if step in (1, 3):
            engine.save_checkpoint(root)  # global_step2, then global_step4
    torch.distributed.barrier()
    if rank == 0:  # the newer ZeRO shards copied over the older ones, `latest` pointed back at the older tag
        older = Path(root) / "global_step2"
        shutil.rmtree(older / "zero")
        shutil.copytree(Path(root) / "global_step4" / "zero", older / "zero")
        _reblessed(older)
        (Path(root) / "latest").write_text("global_step2")
    torch.distributed.barrier()
    fresh, *_ = dstrain.initialize(model=make_model(seed=3), config=config(stage=1, optimizer=ADAMW))
    return _refusal(lambda: fresh.load_checkpoint(root))


def test_a_latest_rolled_back_over_newer_zero_shards_is_refused(tmp_path):
    for message in run_ranks(rolled_back, 2, str(tmp_path), timeout=120):
        assert "global_step2/zero/zero_meta.json belongs to another save (step 4" in message, message
        assert "engine_common.safetensors (step 2" in message, message


def swapped_tensor_ranks(rank, world, root):
    from tp_models import hf_model, tokens, tp_config

    engine, *_ = dstrain.initialize(model=hf_model(), config=tp_config(2, 1))
    ids = tokens(0)
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.save_checkpoint(root, tag="t")
    torch.distributed.barrier()
    if rank == 0:
        _rename_swap(Path(root) / "t" / "tp_00_of_02", Path(root) / "t" / "tp_01_of_02")
        _reblessed(Path(root) / "t")
    torch.distributed.barrier()
    fresh, *_ = dstrain.initialize(model=hf_model(seed=4), config=tp_config(2, 1))
    return _refusal(lambda: fresh.load_checkpoint(root, tag="t"))


def test_swapped_tensor_rank_folders_are_refused(tmp_path):
    pytest.importorskip("transformers")
    for message in run_ranks(swapped_tensor_ranks, 2, str(tmp_path), timeout=180):
        assert "t/tp_00_of_02/engine_rank00000.safetensors records tensor rank [rank, of] [1, 2]" in message, message
        assert "that of tensor rank [rank, of] [0, 2]" in message, message


def swapped_layers(rank, world, root):
    from test_pipe_engine import GAS, batch, layers, token_loss
    from test_pipe_engine import config as pipe_config

    from dstrain.pipe import PipelineModule

    def engine():
        module = PipelineModule(layers(False), num_stages=2, loss_fn=token_loss, seed_layers=True,
                                partition_method="uniform").double()
        return dstrain.initialize(model=module, config=pipe_config(1, 0.0))[0]

    trained = engine()
    trained.train_batch(iter([batch(0, 0, m) for m in range(GAS)]))
    trained.save_checkpoint(root, tag="t")
    torch.distributed.barrier()
    if rank == 0:  # layers 1 and 3 are both Linear(8, 8): the files fit either place
        tag = Path(root) / "t"
        _rename_swap(tag / "layer_01-model_states.safetensors", tag / "layer_03-model_states.safetensors")
        _reblessed(tag)
    torch.distributed.barrier()
    return _refusal(lambda: engine().load_checkpoint(root, tag="t", load_module_only=True))


def test_swapped_layer_files_of_one_shape_are_refused(tmp_path):
    for message in run_ranks(swapped_layers, 2, str(tmp_path), timeout=180):
        assert "t/layer_01-model_states.safetensors records layer 3" in message, message
        assert "that of layer 1" in message, message


def foreign_expert(rank, world, root):
    from moe_models import TinyMoELM, batch

    cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}, "optimizer": ADAMW}
    engine, *_ = dstrain.initialize(model=TinyMoELM(), config=cfg)
    engine.save_checkpoint(root, tag="other")
    engine.backward(engine(batch(0, 0)))
    engine.step()
    engine.save_checkpoint(root, tag="t")
    tag = Path(root) / "t"
    name = "layer_0_expert_2_mp_rank_00_model_states.safetensors"
    shutil.copy(Path(root) / "other" / name, tag / name)  # another checkpoint's expert of the same shape
    _reblessed(tag)
    fresh, *_ = dstrain.initialize(model=TinyMoELM(), config=cfg)
    return _refusal(lambda: fresh.load_checkpoint(root, tag="t", load_module_only=True))


def test_a_foreign_expert_file_is_refused_under_load_module_only(tmp_path):
    message = run_ranks(foreign_expert, 1, str(tmp_path), timeout=120)[0]
    assert "t/layer_0_expert_2_mp_rank_00_model_states.safetensors belongs to another save (step 0" in message, message
    assert "(step 1, save" in message, message
