"""Per-layer checkpoints reload at another number of stages; a stage that dies makes its neighbours
fail with an error naming it, within the timeout, and no process is left behind."""

import multiprocessing
import os
import time

import pipe_models as pm
import pytest
import torch

import dscomm
from dscomm.testing import run_ranks
from dspipe import PipelineError
from dspipe.checkpoint import layer_file


class TorchFiles:
    """A checkpoint engine for the tests: torch's format, read back with weights_only (no code runs)."""

    suffix = ".pt"

    def save(self, state_dict, path):
        torch.save(state_dict, path)

    def load(self, path):
        return torch.load(path, weights_only=True)


def save_rank(rank, world, directory):
    dims = dscomm.ParallelDims(world, pipe=2)
    groups = dims.build()
    module = pm.build(pm.tied_layers(), 2, "1f1b", dims=dims, loss_fn=pm.token_loss)
    pm.train_pipelined(groups, module, "1f1b", 2, 4, pm.token_batch)  # weights no longer those at start
    module.save_state_dict(directory, TorchFiles())
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def load_rank(rank, world, directory):
    dims = dscomm.ParallelDims(world, pipe=world)
    dims.build()
    module = pm.build(pm.tied_layers(), world, "1f1b", dims=dims, loss_fn=pm.token_loss, seed_layers=False)
    module.load_state_dir(directory, TorchFiles())
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def test_weights_saved_at_2_stages_load_at_1_and_4(tmp_path):
    saved_by_rank = run_ranks(save_rank, 2, tmp_path, timeout=120)
    saved = {**saved_by_rank[1], **saved_by_rank[0]}
    # The tied embedding sits on both ranks, equal after training (its gradients were summed).
    torch.testing.assert_close(saved_by_rank[0]["tied_modules.embed.weight"],
                               saved_by_rank[1]["tied_modules.embed.weight"], rtol=0, atol=0)
    layers = len(pm.tied_layers())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(layer_file(tmp_path, i, TorchFiles()).name
                                                                for i in range(layers))

    one = pm.build(pm.tied_layers(), None, "1f1b", dims=dscomm.ParallelDims(1), loss_fn=pm.token_loss,
                   seed_layers=False)
    one.load_state_dir(tmp_path, TorchFiles())
    loaded_at_1 = {n: p.detach() for n, p in one.named_parameters()}
    assert loaded_at_1.keys() == saved.keys()
    for name, value in loaded_at_1.items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)

    loaded_at_4 = run_ranks(load_rank, 4, tmp_path, timeout=120)
    for rank_params in loaded_at_4:
        for name, value in rank_params.items():
            torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    assert set().union(*loaded_at_4) == saved.keys()
    # At 4 stages the tie joins ranks 0 and 3; the middle ranks hold no copy.
    assert ["tied_modules.embed.weight" in params for params in loaded_at_4] == [True, False, False, True]


def tensor_cut_rank(rank, world, directory, save):
    """pipe 2 x tensor 2: each tensor rank holds its own values of its layers (as a tensor-parallel cut does)."""
    dims = dscomm.ParallelDims(world, pipe=2, tensor=2)
    dims.build()
    module = pm.build(pm.mlp_layers(2), 2, "1f1b", dims=dims, seed_layers=False)
    tensor = dims.coords(rank).tensor
    if save:
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.fill_(10 * tensor + len(name))
        module.save_state_dict(directory, TorchFiles())
    else:
        module.load_state_dir(directory, TorchFiles())
    return tensor, {n: p.detach().clone() for n, p in module.named_parameters()}


def test_each_tensor_rank_writes_and_reads_its_own_cut_of_a_layer(tmp_path):
    saved = run_ranks(tensor_cut_rank, 4, tmp_path, True, timeout=120)
    names = sorted(p.name for p in tmp_path.iterdir())
    # DeepSpeed's names for a layout with a model axis: the tensor rank after the layer index
    assert names == sorted(layer_file(tmp_path, layer, TorchFiles(), tensor).name
                           for layer in (0, 2, 3) for tensor in range(2)), names  # layer 1 is a function
    assert "layer_02-model_01-model_states.pt" in names
    for (tensor, loaded), (_, want) in zip(run_ranks(tensor_cut_rank, 4, tmp_path, False, timeout=120), saved):
        for name, value in loaded.items():
            torch.testing.assert_close(value, want[name], rtol=0, atol=0, msg=f"tensor rank {tensor}: {name}")


def test_a_missing_layer_file_names_the_layer_and_what_is_there(tmp_path):
    module = pm.build(pm.mlp_layers(2), None, "1f1b", dims=dscomm.ParallelDims(1))
    module.save_state_dict(tmp_path, TorchFiles())
    layer_file(tmp_path, 2, TorchFiles()).unlink()
    with pytest.raises(PipelineError, match=r"no weights for layer 2 \(layer_02-model_states.pt\) in .*layer files "
                                            r"there: layer_00-model_states.pt"):
        module.load_state_dir(tmp_path, TorchFiles())
    with pytest.raises(PipelineError, match="needs a checkpoint engine"):
        module.save_state_dict(tmp_path, None)


def dying_rank(rank, world, die_at):
    dims = dscomm.ParallelDims(world, pipe=world)
    groups = dims.build()
    module = pm.build(pm.mlp_layers(), world, "1f1b", dims=dims)
    if rank == die_at:
        calls = []

        def die(*_):
            calls.append(1)
            if len(calls) == 6:  # in the second batch
                os._exit(3)  # the process vanishes mid-batch, as a crashed or killed stage does

        module._stage_funcs[module.local_stages[0]][0][1].register_forward_hook(die)
    start = time.monotonic()
    try:
        pm.train_pipelined(groups, module, "1f1b", 2, 4)
    except PipelineError as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


def test_a_stage_that_dies_fails_its_neighbours_naming_it_and_leaves_no_process():
    results = run_ranks(dying_rank, 3, 1, timeout=120, pg_timeout=10, allow_missing=(1,))
    assert results[1] is None  # it exited
    for rank in (0, 2):
        message, seconds = results[rank]
        assert message is not None and seconds < 60, (rank, message)
        assert f"rank {rank} (pipeline rank {rank}), action" in message
        assert "with pipeline rank 1 (global rank 1)" in message
    assert multiprocessing.active_children() == []
