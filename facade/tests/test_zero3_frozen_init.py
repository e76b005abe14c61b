"""ZeRO stage 3 through the engine with a model built under dstrain.zero.Init whose base weights are then frozen
(LoRA / partial fine-tuning): they stay partitioned, and checkpoints and 16-bit saves carry them whole."""

import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dsaio
import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint.files import MODEL_FILE
from dstrain.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

CFG = config(stage=3, optimizer=ADAMW, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0,
                                                           "stage3_gather_16bit_weights_on_model_save": True})


def frozen(name: str) -> bool:
    return not name.startswith("head.")  # the embedding and every layer frozen; the head trains


def _engine(seed):
    torch.manual_seed(seed)
    with dstrain.zero.Init(config_dict_or_path=CFG):
        model = make_model(seed)
    for name, param in model.named_parameters():
        param.requires_grad_(not frozen(name))
    engine, *_ = dstrain.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                    config=CFG)
    return engine


def _weights(engine):
    with dstrain.zero.GatheredParameters(list(engine.module.parameters())):
        return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def save_and_load(rank, world, directory):
    engine = _engine(0)
    before = _weights(engine)
    data = TokenDataset().data
    for i in range(2):
        engine.backward(engine(data[i * 4 + rank * 8:(i + 1) * 4 + rank * 8]))
        engine.step()
    partitioned = all(p.numel() == 0 for n, p in engine.module.named_parameters() if frozen(n))
    saved = _weights(engine)
    engine.save_checkpoint(directory, tag="t")
    engine.save_16bit_model(directory, "model16.safetensors")
    fresh = _engine(9)  # other frozen and trained values: the load must replace both
    differs = any(not torch.equal(v, saved[n]) for n, v in _weights(fresh).items() if frozen(n))
    fresh.load_checkpoint(directory, tag="t")
    still_partitioned = all(p.numel() == 0 for n, p in fresh.module.named_parameters() if frozen(n))
    loaded = _weights(fresh)
    same = {n: torch.equal(loaded[n], saved[n]) for n in saved}
    unchanged = all(torch.equal(saved[n], before[n]) for n in saved if frozen(n))
    trained = any(not torch.equal(saved[n], before[n]) for n in saved if not frozen(n))
    # Training goes on from the loaded weights, as it would have from the saved engine.
    loss_fresh = fresh(data[64 + rank * 4:68 + rank * 4]).item()
    loss_saved = engine(data[64 + rank * 4:68 + rank * 4]).item()
    return partitioned, differs, still_partitioned, same, unchanged, trained, loss_fresh, loss_saved, saved


def test_checkpoint_saves_and_restores_frozen_weights_partitioned_by_init(tmp_path):
    results = run_ranks(save_and_load, 2, str(tmp_path), timeout=180)
    for partitioned, differs, still_partitioned, same, unchanged, trained, loss_fresh, loss_saved, _ in results:
        assert partitioned and differs and still_partitioned
        assert all(same.values()), [n for n, ok in same.items() if not ok]
        assert unchanged and trained
        assert loss_fresh == loss_saved
    saved = results[0][-1]
    module_file = dsaio.load_state_dict(tmp_path / "t" / MODEL_FILE)
    for name, value in saved.items():
        if frozen(name):  # whole in the module file, as DeepSpeed's model states carry frozen parameters
            assert torch.equal(module_file[name], value), name
        else:
            assert name not in module_file  # trained: in ZeRO's shards
    sixteen = dsaio.load(tmp_path / "model16.safetensors")
    assert set(sixteen) == set(saved) and all(torch.equal(sixteen[n], saved[n]) for n in saved)
    # zero_to_fp32: the trained parameters from ZeRO's shards, the frozen ones from the module file, as DeepSpeed's.
    fp32 = get_fp32_state_dict_from_zero_checkpoint(tmp_path, tag="t")
    assert set(fp32) == set(saved) and all(torch.equal(fp32[n], saved[n]) for n in saved)
    trained_only = get_fp32_state_dict_from_zero_checkpoint(tmp_path, tag="t", exclude_frozen_parameters=True)
    assert set(trained_only) == {n for n in saved if not frozen(n)}
