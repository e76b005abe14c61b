"""Checkpoints of a tensor-parallel run: saved at TP 2 x DP 2, loaded at TP 2 (the training goes on as if
never stopped), at TP 1 x DP 4 and at TP 4 x DP 1 (the shards merged and cut anew by the plan); and
save_16bit_model writes the whole model, which loads into the Hugging Face class with the same logits."""

import pytest
import torch
from tp_models import hf_model, tokens, tp_config, whole_parameters

import dscomm
import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint import read_whole


def train(engine, steps, start=0):
    replica = dscomm.groups.current().rank_in("data")
    losses = []
    for step in range(start, start + steps):
        ids = tokens(step, replica)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def reload_rank(rank, world, stage, root):
    engine, *_ = dstrain.initialize(model=hf_model(), config=tp_config(2, stage))
    train(engine, 2)
    engine.save_checkpoint(root, tag="t")
    saved = whole_parameters(engine)
    after = train(engine, 1, start=2)
    results = {}
    for tp in (2, 1, 4):
        again, *_ = dstrain.initialize(model=hf_model(seed=9), config=tp_config(tp, stage))
        again.load_checkpoint(root, tag="t")
        again.save_checkpoint(root, tag=f"re{tp}")  # what was loaded, saved again at this degree
        loaded = whole_parameters(again)
        results[tp] = max((loaded[n] - saved[n]).abs().max().item() for n in saved)
        if tp == 2:  # same layout: optimizer state and counters restored, so the next step is the same step
            results["next_loss"] = abs(train(again, 1, start=2)[0] - after[0])
            results["steps"] = again.global_steps
    return results


def whole_states(directory):
    """Every parameter's fp32 master and Adam moments in a checkpoint, merged over its tensor ranks."""
    return read_whole(directory).parameters


@pytest.mark.parametrize("stage", [1, 3])
def test_reload_at_the_same_and_at_another_tp_degree(stage, tmp_path):
    for results in run_ranks(reload_rank, 4, stage, str(tmp_path / "ckpt"), timeout=300):
        assert results[2] == 0 and results[1] < 1e-6 and results[4] < 1e-6, results
        assert results["next_loss"] < 1e-6 and results["steps"] == 3, results
    assert sorted(p.name for p in (tmp_path / "ckpt" / "t").iterdir() if p.is_dir()) == ["tp_00_of_02", "tp_01_of_02"]
    # The optimizer's state went across too: masters and both Adam moments, merged and cut by the plan.
    saved = whole_states(tmp_path / "ckpt" / "t")
    for tag in ("re1", "re2", "re4"):
        again = whole_states(tmp_path / "ckpt" / tag)
        assert set(again) == set(saved)
        for name, kinds in saved.items():
            assert set(kinds) == {"master", "exp_avg", "exp_avg_sq"} == set(again[name]), (tag, name)
            for kind, value in kinds.items():
                assert torch.equal(again[name][kind], value), (tag, name, kind)


def sixteen_bit_rank(rank, world, stage, root):
    engine, *_ = dstrain.initialize(model=hf_model(), config=tp_config(2, stage))
    train(engine, 1)
    assert engine.save_16bit_model(root, "pytorch_model.bin")
    ids = tokens(7)
    engine.module.eval()
    with torch.no_grad():
        logits = engine.module(input_ids=ids).logits
    fresh = hf_model(seed=5).eval()
    fresh.load_state_dict(torch.load(f"{root}/pytorch_model.bin", weights_only=True))
    with torch.no_grad():
        return (fresh(input_ids=ids).logits - logits).abs().max().item()


def test_save_16bit_model_writes_the_whole_model_for_the_hf_class(tmp_path):
    # Stage 3: the data-parallel shards and the tensor-parallel ones are both gathered.
    for difference in run_ranks(sixteen_bit_rank, 4, 3, str(tmp_path), timeout=240):
        assert difference < 1e-5


@pytest.mark.parametrize("crafted", [0, -1, True, "2", 10**9, None, {"size": 2}])
def test_a_crafted_tp_size_in_the_common_file_is_refused_by_name(crafted, tmp_path):
    from dstrain.checkpoint.layout import SavedLayout

    tp = crafted if isinstance(crafted, dict) else {"size": crafted, "plan": "{}"}
    with pytest.raises(dstrain.CheckpointLoadError, match="tp_size"):
        SavedLayout.from_description({"tp": tp, "pipe": None, "dp_size": 1, "zero_stage": 0}, tmp_path)
