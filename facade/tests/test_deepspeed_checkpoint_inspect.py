"""DeepSpeed's checkpoint inspectors (`deepspeed.checkpoint.DeepSpeedCheckpoint`, `ZeROCheckpoint`,
`model_3d_desc`): degrees read from real DeepSpeed-named files, and the ranks a smaller layout reads. Imported
from dstrain.compat.checkpoint (what `deepspeed.checkpoint` is under the alias, checked in
test_deepspeed_paths_round3.py), so this process keeps no alias."""

import os

import pytest
import torch

from dstrain.errors import CheckpointLoadError


def _write(folder, pp, tp, dp, *, recorded=True, layers=False, extra=None):
    for mp in range(pp * tp):
        state = {"param_shapes": [{}], "iteration": 7, "universal_checkpoint_info": {"writer": mp}}
        if recorded:
            state["checkpoint_parallel_dimensions"] = {"pp_degree": pp, "tp_degree": tp}
        state.update((extra or {}).get(mp, {}))
        torch.save(state, os.path.join(folder, f"mp_rank_{mp:02d}_model_states.pt"))
        for dp_rank in range(dp):
            torch.save({}, os.path.join(folder, f"bf16_zero_pp_rank_{dp_rank}_mp_rank_{mp:02d}_optim_states.pt"))
    if layers:
        for t in range(tp):
            torch.save({}, os.path.join(folder, f"layer_01-model_{t:02d}-model_states.pt"))


def test_reshape_maps_ranks_of_a_larger_layout():
    from dstrain.compat.checkpoint import model_3d_desc

    src = model_3d_desc(pp_degree=2, tp_degree=2, dp_degree=2)
    assert src.reshape(model_3d_desc(1, 1, 1))[0].get_data(pp_index=0, tp_index=0) == [0, 4, 1, 5, 2, 6, 3, 7]
    half = src.reshape(model_3d_desc(pp_degree=1, tp_degree=2, dp_degree=2))
    assert [half[d].get_data(0, t) for d in range(2) for t in range(2)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert src.reshape(model_3d_desc(2, 1, 1))[0].get_data(1, 0) == [2, 6, 3, 7]
    ok, why = src.can_reshape(model_3d_desc(4, 2, 2))
    assert not ok and "PP: 2 ---> 4" in why[0]
    with pytest.raises(ValueError, match="Expansion reshape not supported - TP"):
        src.reshape(model_3d_desc(2, 4, 1))
    with pytest.raises(ValueError, match="equal parts"):  # 3 tensor ranks do not merge into 2
        model_3d_desc(1, 3, 1).reshape(model_3d_desc(1, 2, 1))
    with pytest.raises(ValueError, match="pp_degree"):
        model_3d_desc(pp_degree=0)


def test_inspector_reads_degrees_once_per_file(tmp_path, monkeypatch):
    from dstrain.compat.checkpoint import UNIVERSAL_CHECKPOINT_INFO, DeepSpeedCheckpoint, ZeROCheckpoint
    from dstrain.compat.checkpoint.utils import get_model_ckpt_name_for_rank, get_zero_ckpt_name_for_rank

    _write(tmp_path, pp=2, tp=1, dp=2)
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: loads.append(str(path)) or real_load(path, *a, **k))
    checkpoint = DeepSpeedCheckpoint(str(tmp_path))
    assert loads == checkpoint.mp_rank_files  # each model-states file read once, nothing else
    assert (checkpoint.pp_degree, checkpoint.tp_degree, checkpoint.dp_degree) == (2, 1, 2)
    assert checkpoint.get_checkpoint_info(UNIVERSAL_CHECKPOINT_INFO) == {"writer": 0}
    assert checkpoint.get_iteration() == 7
    assert checkpoint.mp_rank_files[1] == get_model_ckpt_name_for_rank(str(tmp_path), "01")
    # source rank dp * 2 + mp: the second stage's files at both data ranks
    assert checkpoint.get_zero_files(1, 0, 1) == [os.path.join(tmp_path, "bf16_" + os.path.basename(
        get_zero_ckpt_name_for_rank(str(tmp_path), 1, 1)))]
    merged = DeepSpeedCheckpoint(str(tmp_path), pp_degree=1, dp_degree=1)
    assert merged.is_change_pp_degree() and not merged.is_change_tp_degree()
    assert [os.path.basename(f)[:30] for f in merged.get_zero_files(0, 0, 0)] == [
        "bf16_zero_pp_rank_0_mp_rank_00", "bf16_zero_pp_rank_1_mp_rank_00",
        "bf16_zero_pp_rank_0_mp_rank_01", "bf16_zero_pp_rank_1_mp_rank_01"]
    assert ZeROCheckpoint(str(tmp_path)).get_src_dp_degree() == 2
    with pytest.raises(CheckpointLoadError, match="cannot be read at"):
        DeepSpeedCheckpoint(str(tmp_path), tp_degree=2)


def test_degrees_of_older_checkpoints_and_inconsistent_ones(tmp_path):
    from dstrain.compat.checkpoint import ZeROCheckpoint, get_model_3d_descriptor

    legacy, pipeline, missing, mixed = (tmp_path / name for name in ("legacy", "pipeline", "missing", "mixed"))
    for folder in (legacy, pipeline, missing, mixed):
        folder.mkdir()
    _write(legacy, pp=1, tp=2, dp=2, recorded=False)  # counted: 2 model files, 4 ZeRO files
    descriptor = get_model_3d_descriptor(str(legacy))
    assert (descriptor.pp_degree, descriptor.tp_degree, descriptor.dp_degree) == (1, 2, 2)
    assert ZeROCheckpoint(str(legacy)).get_src_tp_degree() == 2
    _write(pipeline, pp=2, tp=1, dp=1, recorded=False, layers=True)  # tensor ranks from layer 01's files
    assert get_model_3d_descriptor(str(pipeline)).pp_degree == 2
    _write(missing, pp=2, tp=1, dp=1, extra={1: {"checkpoint_parallel_dimensions": None}})
    with pytest.raises(RuntimeError, match="missing from model-state files"):
        get_model_3d_descriptor(str(missing))
    _write(mixed, pp=2, tp=1, dp=1, extra={1: {"checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 2}}})
    with pytest.raises(RuntimeError, match="disagrees across model-state files"):
        get_model_3d_descriptor(str(mixed))
    os.remove(legacy / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt")
    with pytest.raises(CheckpointLoadError, match="incomplete"):
        get_model_3d_descriptor(str(legacy))


def test_file_lists_in_rank_order(tmp_path):
    from dstrain.compat.utils.zero_to_fp32 import get_model_state_files, get_optim_files

    names = [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(12)]
    for name in reversed(names):
        (tmp_path / name).write_text("x")
    (tmp_path / "mp_rank_00_model_states.pt").write_text("x")
    assert [os.path.basename(f) for f in get_optim_files(tmp_path)] == names  # 2 before 10, as numbers
    assert [os.path.basename(f) for f in get_model_state_files(tmp_path)] == ["mp_rank_00_model_states.pt"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \*_optim_states\.pt files"):
        get_optim_files(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
        get_optim_files(tmp_path / "nothing")
