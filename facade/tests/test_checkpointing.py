"""dstrain.checkpointing is dscomm's activation checkpointing under DeepSpeed's name: the same functions and
state, configured by the engine from the config (its behaviour is tested in libs/dscomm/tests)."""

import torch
from engine_models import ADAMW, config, make_model

import dscomm.checkpointing
import dstrain
from dscomm.testing import run_ranks


def test_every_public_name_is_dscomms_own():
    assert dstrain.checkpointing.__all__ == dscomm.checkpointing.__all__
    for name in dscomm.checkpointing.__all__:
        assert getattr(dstrain.checkpointing, name) is getattr(dscomm.checkpointing, name), name
    assert "checkpoint" in dstrain.checkpointing.__all__ and "get_cuda_rng_tracker" in dstrain.checkpointing.__all__


def _configured_through_both_names(rank, world):
    dstrain.checkpointing.configure(profile=True)
    dstrain.checkpointing.model_parallel_cuda_manual_seed(1)
    block = torch.nn.Linear(4, 4)
    dstrain.checkpointing.checkpoint(block, torch.randn(2, 4, requires_grad=True)).sum().backward()
    timings = dscomm.checkpointing.profile_timings()  # one state, whichever name configured it
    with dscomm.checkpointing.get_cuda_rng_tracker().fork():
        pass
    return timings["forward"]["count"], timings["recompute"]["count"]


def _engine_settings(rank, world, section):
    dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW, activation_checkpointing=section))
    settings = dscomm.checkpointing._settings
    return dscomm.checkpointing.is_configured(), settings.cpu_checkpointing, settings.synchronize


def test_one_state_behind_both_names_and_the_engine_configures_it():
    assert run_ranks(_configured_through_both_names, 1)[0] == (1, 1)
    section = {"cpu_checkpointing": True, "synchronize_checkpoint_boundary": True}
    assert run_ranks(_engine_settings, 1, section)[0] == (True, True, True)
