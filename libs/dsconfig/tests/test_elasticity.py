"""The elastic batch-size arithmetic (DeepSpeed's `compute_elastic_config`), checked against hand-worked cases."""

import copy

import pytest

import dsconfig
from dsconfig.elasticity import (
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
    check_same_elastic_config,
    compute_elastic_config,
    elastic_batch,
    read_elasticity,
    valid_gpu_counts,
)

SECTION = {"enabled": True, "max_train_batch_size": 10000, "micro_batch_sizes": [8, 12, 16, 17], "min_gpus": 32,
           "max_gpus": 1500, "min_time": 20, "version": 0.1}


def config(**changes):
    section = copy.deepcopy(SECTION)
    section.update(changes)
    return {"elasticity": section}


def test_the_batch_that_the_most_gpu_counts_divide():
    batch, gpus = compute_elastic_config(config())
    assert (batch, len(gpus)) == (9792, 23)
    for count in gpus:  # every count splits the batch into whole micro-batches of one listed size
        assert 32 <= count <= 1500 and batch % count == 0
        assert any((batch // count) % micro == 0 for micro in SECTION["micro_batch_sizes"])
    assert compute_elastic_config(config(), world_size=64) == (9792, gpus, 17)  # 153 per GPU = 9 x 17
    with pytest.raises(ElasticityIncompatibleWorldSize, match="world_size = 128"):
        compute_elastic_config(config(), world_size=128)


def test_small_cases_worked_by_hand():
    # bases 1, 2, 3, 7 and lcm 42 (> 32, left out) scaled by highly composite numbers within 32: 24, 24, 24, 28
    assert compute_elastic_config(config(max_train_batch_size=32, micro_batch_sizes=[1, 2, 3, 7], min_gpus=1),
                                  world_size=4) == (24, [1, 2, 3, 4, 6, 8, 12, 24], 3)
    batch, _ = compute_elastic_config(config(max_train_batch_size=100, micro_batch_sizes=[8, 10, 12], min_gpus=1))
    assert batch == 96
    assert valid_gpu_counts(24, [4, 6], 1, 100) == [1, 2, 3, 4, 6]


def test_node_level_version_with_model_parallelism():
    # 8 GPUs per node, model replicas 4 wide: 2 data-parallel replicas per node; 16 GPUs run 4 replicas
    batch, replicas, micro = compute_elastic_config(config(version=0.2, model_parallel_size=4, num_gpus_per_node=8),
                                                    return_microbatch=True, running_world_size=16)
    assert (batch, replicas, micro) == (9996, [4], 17)  # 4 replicas x 147 micro-batches of 17
    with pytest.raises(ElasticityConfigError, match="num_gpus_per_node"):
        compute_elastic_config(config(version=0.2, model_parallel_size=16, num_gpus_per_node=8), world_size=16)
    with pytest.raises(ElasticityConfigError, match="running world size"):
        compute_elastic_config(config(version=0.2))
    with pytest.raises(ElasticityConfigError, match=r"version 0\.2"):
        compute_elastic_config(config(model_parallel_size=4, num_gpus_per_node=8))


@pytest.mark.parametrize("key, value", [("micro_batch_sizes", [1, 4, -1]), ("micro_batch_sizes", 5),
                                        ("micro_batch_sizes", ["a", None]), ("micro_batch_sizes", [2, 0.5]),
                                        ("micro_batch_sizes", [True]), ("min_gpus", -1), ("max_gpus", 0),
                                        ("min_time", -3), ("version", "0.3"), ("version", "new"), ("enabled", "yes"),
                                        ("max_train_batch_size", 4), ("min_gpus", 2000), ("typo_key", 1)])
def test_bad_values_are_named(key, value):
    with pytest.raises(ElasticityConfigError) as info:
        compute_elastic_config(config(**{key: value}))
    assert isinstance(info.value, dsconfig.ConfigError)
    assert any(key in path or (key == "max_train_batch_size" and "micro_batch_sizes" in path)
               for path in info.value.paths), info.value


def test_missing_disabled_and_old_targets():
    with pytest.raises(ElasticityConfigError) as info:
        compute_elastic_config({"elasticity": {"enabled": True}})
    assert sorted(info.value.paths) == ["elasticity.max_train_batch_size", "elasticity.micro_batch_sizes"]
    for bad in ({}, {"elasticity": {"enabled": False}}, config(enabled=False), []):
        with pytest.raises(ElasticityConfigError):
            compute_elastic_config(bad)
    with pytest.raises(ElasticityError, match=r"0\.3\.8"):
        compute_elastic_config(config(), target_deepspeed_version="0.2")
    assert compute_elastic_config(config(), target_deepspeed_version="0.19.8+cu12")[0] == 9792


def test_the_scheduler_copy_must_agree():
    runtime = config()["elasticity"]
    check_same_elastic_config(runtime, copy.deepcopy(runtime))
    with pytest.raises(ElasticityConfigError, match="max_train_batch_size"):
        check_same_elastic_config(runtime, {**runtime, "max_train_batch_size": 27})
    section = read_elasticity(runtime)
    assert (section.max_acceptable_batch_size, section.micro_batches) == (10000, [8, 12, 16, 17])


SMALL = {"enabled": True, "max_train_batch_size": 4, "micro_batch_sizes": [1, 2, 3, 4], "min_gpus": 1, "max_gpus": 4,
         "version": 0.1}


def batch_of(cfg):
    return cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps


def test_load_takes_the_batch_from_elasticity_at_each_data_parallel_size():
    # batch 4 divides among 1, 2 and 4 ranks; the largest listed micro batch that divides each share is used
    for size, triple in ((1, (4, 4, 1)), (2, (4, 2, 1)), (4, (4, 1, 1))):
        cfg = dsconfig.load({"elasticity": SMALL}, world_size=size)
        assert batch_of(cfg) == triple and cfg.elasticity.enabled
        assert dsconfig.load(cfg.to_dict(), world_size=size) == cfg  # its own batch keys are elasticity's
    # a size the batch does not divide is named with the sizes that work
    with pytest.raises(ElasticityIncompatibleWorldSize, match=r"valid sizes: \[1, 2, 4\]"):
        dsconfig.load({"elasticity": SMALL}, world_size=3)
    # accumulation takes up what the micro batch leaves: batch 24 at 2 ranks with micro batches of at most 4
    cfg = dsconfig.load({"elasticity": dict(SMALL, max_train_batch_size=24, micro_batch_sizes=[4])}, world_size=2)
    assert batch_of(cfg) == (24, 4, 3)


def test_batch_keys_beside_elasticity_are_an_error_unless_ignored():
    with pytest.raises(ElasticityConfigError) as info:
        dsconfig.load({"elasticity": SMALL, "train_batch_size": 2, "gradient_accumulation_steps": 1}, world_size=2)
    assert info.value.paths == ["train_batch_size"]  # accumulation 1 is what elasticity picks too
    assert "ignore_non_elastic_batch_info" in str(info.value) and "picks train_batch_size = 4" in str(info.value)
    with pytest.warns(dsconfig.ConfigWarning, match="train_batch_size = 2 -> 4"):
        cfg = dsconfig.load({"elasticity": dict(SMALL, ignore_non_elastic_batch_info=True), "train_batch_size": 2},
                            world_size=2)
    assert batch_of(cfg) == (4, 2, 1)
    # "auto" (a Hugging Face config) is filled in, not a conflict
    cfg = dsconfig.load({"elasticity": SMALL, "train_batch_size": "auto"}, world_size=2)
    assert batch_of(cfg) == (4, 2, 1)
    # a disabled section leaves the batch as written
    cfg = dsconfig.load({"elasticity": dict(SMALL, enabled=False), "train_batch_size": 2}, world_size=2)
    assert batch_of(cfg) == (2, 1, 1) and not cfg.elasticity.enabled


def test_a_bad_section_is_reported_with_the_rest_of_the_config():
    with pytest.raises(ElasticityConfigError) as info:
        dsconfig.load({"elasticity": {"enabled": True, "typo": 1}, "zero_optimization": {"stage": 9}})
    assert sorted(info.value.paths) == ["elasticity.max_train_batch_size", "elasticity.micro_batch_sizes",
                                        "elasticity.typo", "zero_optimization.stage"]


def test_node_level_batch_counts_replicas_of_model_parallel_width():
    section = read_elasticity(dict(SECTION, version=0.2, model_parallel_size=4, num_gpus_per_node=8))
    batch = elastic_batch(section, 4)  # 4 replicas of 4 GPUs: 16 GPUs, 2 nodes
    assert (batch.train_batch_size, batch.train_micro_batch_size_per_gpu, batch.gradient_accumulation_steps) == \
        (9996, 17, 147)


def test_prefer_larger_batch_breaks_a_tie_between_batches():
    # 30 (6 x 5), 28 (4 x 7) and 35 (the lcm) each run on one GPU only: a tie the preference settles
    section = dict(enabled=True, max_train_batch_size=40, micro_batch_sizes=[5, 7], min_gpus=1, max_gpus=1,
                   version=0.1)
    assert dsconfig.load({"elasticity": section}).train_batch_size == 35
    assert dsconfig.load({"elasticity": dict(section, prefer_larger_batch=False)}).train_batch_size == 28
