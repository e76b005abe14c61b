"""Pipeline checkpoints: a save at 2 stages resumes exactly at 2, and loads whole at 1 and 4 stages: the
weights from the layer files, the optimizer's masters and Adam moments from every stage's shards, so the
next steps equal the uninterrupted 2-stage run's."""

import torch
from test_pipe_engine import GAS, batch, config, layers, token_loss

import dstrain
from dscomm.testing import run_ranks
from dstrain.pipe import PipelineModule


def engine_at(stages):
    module = PipelineModule(layers(True), num_stages=stages, loss_fn=token_loss, seed_layers=True,
                            partition_method="uniform").double()
    engine, *_ = dstrain.initialize(model=module, config=config(1, 0.5, schedule="zb_h1"))
    return engine, module


def train(engine, steps, first=0):
    replica = engine.groups.rank_in("data")
    return [engine.train_batch(iter([batch(step, replica, m) for m in range(GAS)])).item()
            for step in range(first, first + steps)]


def weights(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def save_and_resume(rank, world, directory):
    engine, module = engine_at(2)
    train(engine, 2)
    engine.save_checkpoint(directory, client_state={"epoch": 3})
    saved = weights(module)
    after = train(engine, 2, first=2)
    fresh, _ = engine_at(2)
    _, client = fresh.load_checkpoint(directory)
    resumed = train(fresh, 2, first=2)
    return saved, after, resumed, client, fresh.global_steps, fresh.global_samples


def load_elsewhere(rank, world, directory):
    engine, module = engine_at(world)
    _, client = engine.load_checkpoint(directory)
    loaded = weights(module)
    losses = train(engine, 2, first=2)  # the same batches the saved run trained on after its save
    return loaded, losses, engine.global_steps, client


def test_a_checkpoint_resumes_at_2_stages_and_continues_alike_at_1_and_4(tmp_path):
    results = run_ranks(save_and_resume, 2, tmp_path, timeout=240)
    saved = {}
    for saved_by_rank, after, resumed, client, steps, samples in results:
        saved.update(saved_by_rank)
        # Optimizer state, scheduler and counters came back (dszero keeps saved masters in fp32, hence not bitwise).
        torch.testing.assert_close(resumed, after, rtol=1e-7, atol=0)
        assert client == {"epoch": 3} and steps == 4 and samples == 4 * GAS * 2
    uninterrupted = results[0][1]
    assert sorted(p.name for p in (tmp_path / "global_step2").iterdir() if p.name.startswith("layer_")) == \
        [f"layer_{i:02d}-model_states.safetensors" for i in range(len(layers(True)))]
    for world in (1, 4):
        for loaded, losses, steps, client in run_ranks(load_elsewhere, world, tmp_path, timeout=240):
            for name, value in loaded.items():
                torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
            # Two steps on: the second would differ with fresh Adam moments (or a lost step count).
            torch.testing.assert_close(losses, uninterrupted, rtol=1e-7, atol=0, msg=f"{world} stage(s)")
            assert steps == 4 and client == {"epoch": 3}
