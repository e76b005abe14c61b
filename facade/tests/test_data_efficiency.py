"""Curriculum learning through initialize(training_data=...): the sampler-driven loader on 2 gloo ranks
(batches within the difficulty, disjoint per rank), an exact resume through save_checkpoint /
load_checkpoint, custom schedules, the seqlen post-processing, monitors and the enabled keys."""

import csv
import warnings

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dsconfig
import dsdata
import dstrain
from dscomm.testing import run_ranks

SMALL = 10  # the metric: how many of a sample's 13 tokens are below 10


def small_tokens(batch):
    return (batch < SMALL).sum(dim=1)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    path = tmp_path_factory.mktemp("analysis")
    dsdata.DataAnalyzer(TokenDataset(), batch_size=64, metric_names=["small"], metric_functions=[small_tokens],
                        metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64],
                        save_path=str(path)).run_map_reduce()
    return path


def curriculum(index, **metric):
    small = {"index_to_sample_path": str(index / "small" / "small_index_to_sample"),
             "index_to_metric_path": str(index / "small" / "small_index_to_metric"), "difficulty_type": "value",
             "clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 6,
             "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 5, "difficulty_step": 1}}
    small.update(metric)
    return {"enabled": True, "seed": 7, "data_sampling": {"enabled": True, "num_epochs": 4, "curriculum_learning": {
        "enabled": True, "data_cluster_path": str(index / "clusters"), "curriculum_metrics": {"small": small}}}}


def _train(loader, engine, steps):
    batches, losses = [], []
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        batches.append(batch.clone())
        losses.append(loss.item())
        if len(losses) == steps:
            return batches, losses
    raise AssertionError("the loader ended early")


def _resume_run(rank, world, index, checkpoints):
    def build():
        engine, _, loader, _ = dstrain.initialize(model=make_model(), config=config(
            micro=2, gas=2, optimizer=ADAMW, data_efficiency=curriculum(index)), training_data=TokenDataset())
        return engine, loader

    engine, loader = build()
    assert isinstance(loader, dsdata.SampledDataLoader) and loader is engine.training_dataloader
    first, _ = _train(loader, engine, 6)  # 3 optimizer steps
    engine.save_checkpoint(checkpoints, tag="step3")
    expected, expected_losses = _train(loader, engine, 8)
    engine.destroy()
    resumed, loader = build()
    resumed.load_checkpoint(checkpoints, tag="step3")
    got, got_losses = _train(loader, resumed, 8)
    return {"first": first, "expected": expected, "got": got, "losses": (expected_losses, got_losses),
            "difficulty": loader.state_dict()["current_difficulties"]["small"]}


def test_sampler_loader_on_two_ranks_resumes_exactly_through_checkpoints(index, tmp_path):
    results = run_ranks(_resume_run, 2, index, str(tmp_path), timeout=240)
    for result in results:
        assert all(torch.equal(a, b) for a, b in zip(result["expected"], result["got"]))
        assert result["losses"][0] == result["losses"][1]
    zero, one = results
    for micro, (a, b) in enumerate(zip(zero["first"] + zero["expected"], one["first"] + one["expected"])):
        assert not {tuple(r) for r in a.tolist()} & {tuple(r) for r in b.tolist()}  # disjoint slices
        step = micro // 2 + 1  # 2 micro-batches per global batch; the schedule: 1 + step, at most 6
        assert int(small_tokens(torch.cat([a, b])).max()) <= min(1 + step, 6), micro


def _custom_and_post_process(rank, world):
    seqlen = {"clustering_type": "single_cluster", "min_difficulty": 3, "max_difficulty": 12, "schedule_type": "custom"}
    de = {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "curriculum_metrics": {"seqlen": seqlen}}}}
    engine, _, loader, _ = dstrain.initialize(model=make_model(), config=config(micro=2, optimizer=ADAMW,
                                                                                  data_efficiency=de),
                                              training_data=TokenDataset())
    engine.set_custom_curriculum_learning_schedule({"seqlen": lambda step: 2 + 2 * step})
    engine.set_data_post_process_func(dsdata.seqlen_post_process("seqlen", extra_tokens=1))
    with pytest.raises(dstrain.DstrainError, match="'vocab'"):
        engine.set_custom_curriculum_learning_schedule({"vocab": lambda step: 1})
    return [_train(loader, engine, 1)[0][0].shape[1] for _ in range(6)]


def test_custom_schedule_and_seqlen_post_processing():
    # step s gets 2 + 2s tokens plus one for the targets, from min 3 (kept: never below it) to max 12
    assert run_ranks(_custom_and_post_process, 1, timeout=120)[0] == [5, 7, 9, 11, 13, 13]


LTD = {"enabled": True, "total_layer_num": 2, "random_ltd_layer_num": 1, "random_ltd_layer_id": [1],
       "model_mask_name": None, "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
       "random_ltd_schedule": {"min_value": 4, "max_value": 12, "schedule_type": "fixed_linear",
                               "schedule_config": {"require_steps": 4, "seq_per_step": 4}}}


def _monitored(rank, world, directory):
    engine, _, loader, _ = dstrain.initialize(model=make_model(), config=config(
        micro=2, optimizer=ADAMW, csv_monitor={"enabled": True, "output_path": directory, "job_name": "job"},
        data_efficiency={"enabled": True, "data_routing": {"enabled": True, "random_ltd": LTD}}),
        training_data=TokenDataset())
    dstrain.convert_to_random_ltd(engine, torch.nn.Sequential)
    _train(loader, engine, 5)
    engine.destroy()


def test_monitors_report_consumed_tokens_and_layer_tokens(tmp_path):
    run_ranks(_monitored, 2, str(tmp_path), timeout=120)

    def column(name):
        rows = list(csv.reader(next(tmp_path.rglob(f"Train_Samples_{name}.csv")).read_text().splitlines()))[1:]
        return [(int(float(step)), float(value)) for step, value in rows]

    # 4 samples a step of 12 tokens; the random-LTD layer keeps 4 + 8 * step / 4 rounded down to a multiple of 4
    # (4, 4, 8, 8, 12), the other layer all 12
    kept = [4, 4, 8, 8, 12]
    layer_tokens = [4 * sum(k + 12 for k in kept[:n]) for n in range(1, 6)]
    assert column("consumed_layer_tokens") == [(4 * n, t) for n, t in zip(range(1, 6), layer_tokens)]
    assert column("consumed_tokens") == [(4 * n, 48.0 * n) for n in range(1, 6)]
    assert [v for _, v in column("random_ltd_reserved_length")] == [4, 8, 8, 12, 12]  # for the next step


def _switches(rank, world, index):
    de = curriculum(index)
    de["enabled"] = False  # DeepSpeed starts its curriculum sampler from curriculum_learning.enabled alone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, loader, _ = dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW, data_efficiency=de),
                                             training_data=TokenDataset())
        dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW, data_efficiency=curriculum(index)))
    return type(loader).__name__, [str(w.message) for w in caught if issubclass(w.category, dsconfig.ConfigWarning)]


def test_curriculum_runs_from_its_own_key_and_says_so(index):
    loader, messages = run_ranks(_switches, 1, index, timeout=120)[0]
    assert loader == "SampledDataLoader"
    assert any("curriculum_learning.enabled is true while data_efficiency.enabled" in m and "as in DeepSpeed" in m
               for m in messages)
    assert any("no training_data" in m for m in messages)
