"""The engine's parts without the engine: the progress counters, a training loop written against
`build_training_parts` whose checkpoint a DeepSpeedEngine loads, and the engine's DeepSpeed
attributes reading and writing through to the parts."""

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint import save_checkpoint
from dstrain.engine.parts import build_training_parts
from dstrain.engine.progress import TrainingProgress
from dstrain.wiring.config_source import load_config


def test_progress_counts_boundaries_samples_and_micro_steps():
    progress = TrainingProgress()
    boundaries = []
    for _ in range(6):
        progress.record_backward()
        boundary = progress.is_boundary(3)
        boundaries.append(boundary)
        progress.count_step(boundary, 12 if boundary else 0)
    assert boundaries == [False, False, True, False, False, True]
    assert (progress.global_steps, progress.global_samples, progress.micro_steps) == (2, 24, 6)
    assert progress.is_boundary(None)  # unmanaged accumulation: every step is a boundary
    progress.boundary_override = True
    assert progress.is_boundary(3)


def test_progress_counts_the_backwards_of_an_unmanaged_step():
    progress = TrainingProgress()
    assert progress.micro_batches_in_step() == 1  # a step without backward still consumes its batch
    for _ in range(3):
        progress.record_backward()
    assert progress.micro_batches_in_step() == 3
    progress.count_step(True, 0)
    assert progress.micro_batches_in_step() == 1


def test_progress_state_dict_round_trips_and_leaves_the_step_in_progress_out():
    progress = TrainingProgress()
    progress.global_steps, progress.global_samples, progress.micro_steps = 7, 56, 14
    progress.record_backward()
    state = progress.state_dict()
    assert state == {"global_steps": 7, "global_samples": 56, "micro_steps": 14}
    restored = TrainingProgress()
    restored.boundary_override = False
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.backwards_since_step == 0 and restored.boundary_override is None


@pytest.mark.parametrize("bad", [{"global_steps": "7", "global_samples": 1, "micro_steps": 1},
                                 {"global_samples": 1, "micro_steps": 1},
                                 {"global_steps": -1, "global_samples": 1, "micro_steps": 1}])
def test_progress_refuses_a_bad_state_naming_the_counter(bad):
    with pytest.raises(dstrain.CheckpointLoadError, match="global_steps"):
        TrainingProgress().load_state_dict(bad)


def parts_loop_then_engine_load(rank, world, directory):
    """A loop of its own over the parts (as a pipeline engine would be), saved; an engine loads it."""
    cfg, _ = load_config(config(stage=2, optimizer=ADAMW), world)
    model = make_model()
    parts = build_training_parts(model, cfg, data_parallel_group=None)
    data = TokenDataset().data
    for step in range(3):
        loss = parts.module(data[step * 4:(step + 1) * 4])
        (loss * parts.optimizer.backward_scale).backward()
        parts.optimizer.step()
        parts.progress.count_step(True, cfg.train_batch_size)
        parts.reporter.after_step(parts.optimizer, parts.basic_optimizer)
    save_checkpoint(parts, directory, None, {"by": "parts"}, True)
    weights = [p.detach().clone() for p in model.parameters()]
    engine, *_ = dstrain.initialize(model=make_model(seed=3), config=config(stage=2, optimizer=ADAMW))
    path, client = engine.load_checkpoint(directory)
    same = all(torch.equal(a, b) for a, b in zip(weights, engine.module.parameters()))
    parts.close()
    return path.endswith("global_step3"), client, engine.global_steps, engine.global_samples, same


def test_a_loop_over_the_parts_saves_a_checkpoint_the_engine_loads(tmp_path):
    for named, client, steps, samples, same in run_ranks(parts_loop_then_engine_load, 2, str(tmp_path), timeout=120):
        assert named and client == {"by": "parts"} and (steps, samples) == (3, 24) and same


def engine_attributes_write_through(rank, world, directory):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW))
    engine.global_steps, engine.global_samples, engine.micro_steps = 40, 160, 80
    replacement = torch.optim.lr_scheduler.StepLR(engine.basic_optimizer, step_size=5, gamma=0.5)
    engine.lr_scheduler = replacement
    data = TokenDataset().data
    engine.backward(engine(data[:4]))
    engine.step()  # the replacement is stepped, and the counters continue from the values written
    engine.save_checkpoint(directory)
    fresh, *_ = dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW))
    fresh.lr_scheduler = torch.optim.lr_scheduler.StepLR(fresh.basic_optimizer, step_size=5, gamma=0.5)
    path, _ = fresh.load_checkpoint(directory)
    return (path.endswith("global_step41"), replacement.last_epoch, (fresh.global_steps, fresh.global_samples,
            fresh.micro_steps), fresh.lr_scheduler.last_epoch)


def test_engine_counters_and_scheduler_are_writable_and_saved(tmp_path):
    named, stepped, counters, loaded_epoch = run_ranks(engine_attributes_write_through, 1, str(tmp_path))[0]
    assert named and stepped == 1 and counters == (41, 164, 81) and loaded_epoch == 1
