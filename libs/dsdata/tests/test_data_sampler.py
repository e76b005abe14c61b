"""The curriculum sampler: batches within the current difficulty (value, percentile, two metrics), the
global batch split over 2 gloo ranks, and an exact resume (also with a prefetching loader)."""

import json

import pytest
import torch
from test_data_analyzer import Tokens, length, total

from dscomm.testing import run_ranks
from dsdata import DataAnalyzer, DataEfficiencyError, DataSampler, SampledDataLoader, fixed_linear

SAMPLES = len(Tokens())


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    path = tmp_path_factory.mktemp("index")
    DataAnalyzer(Tokens(), batch_size=100, metric_names=["length", "total"], metric_functions=[length, total],
                 metric_types=["single_value_per_sample"] * 2, metric_dtypes=[torch.int64] * 2,
                 save_path=str(path)).run_map_reduce()
    return path


def metric(index, name, difficulty_type="value", lo=2, hi=20, total_steps=10, step=2, **extra):
    sample_file = f"{name}_index_to_sample" + ("_percentile_merged" if difficulty_type == "percentile" else "")
    return {"index_to_sample_path": str(index / name / sample_file),
            "index_to_metric_path": str(index / name / f"{name}_index_to_metric"), "difficulty_type": difficulty_type,
            "clustering_type": "schedule_based", "min_difficulty": lo, "max_difficulty": hi,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": total_steps, "difficulty_step": step}, **extra}


def config(index, epochs=1, seed=1234, **metrics):
    return {"enabled": True, "seed": seed, "data_sampling": {"enabled": True, "num_epochs": epochs, "curriculum_learning": {
        "enabled": True, "data_cluster_path": str(index / "clusters"), "curriculum_metrics": metrics}}}


def global_batches(sampler, count):
    """The first `count` global batches as lists of sample indices (a single-rank sampler)."""
    per_global = sampler.global_batch_size // sampler.micro_batch_times_data_parallel_size
    micro = iter(sampler)
    return [[i for _ in range(per_global) for i in next(micro)] for _ in range(count)]


def test_batches_stay_within_the_value_difficulty_and_clusters_open_as_it_rises(index):
    sampler = DataSampler(config(index, length=metric(index, "length")), SAMPLES, 4, 0, 1,
                          gradient_accumulation_steps=2)
    lengths = length(Tokens().data)
    for step, batch in enumerate(global_batches(sampler, 14), start=1):
        difficulty = fixed_linear(step, min_difficulty=2, max_difficulty=20, total_curriculum_step=10,
                                  difficulty_step=2)
        assert len(batch) == 8 and int(lengths[batch].max()) <= difficulty, (step, batch)
    assert len(sampler.clusters) == 10  # difficulties 2, 4, ..., 20: one cluster each
    assert sum(c.members.size for c in sampler.clusters) == SAMPLES


def test_percentile_difficulty_admits_the_easiest_share(index):
    sampler = DataSampler(config(index, total=metric(index, "total", "percentile", lo=10, hi=100, step=10)),
                          SAMPLES, 5, 0, 1)
    totals = total(Tokens().data)
    ranked = sorted(range(SAMPLES), key=lambda i: (int(totals[i]), i))  # the merged index's order
    for step, batch in enumerate(global_batches(sampler, 12), start=1):
        percentile = fixed_linear(step, min_difficulty=10, max_difficulty=100, total_curriculum_step=10,
                                  difficulty_step=10)
        admitted = set(ranked[:SAMPLES if percentile == 100 else (SAMPLES // 100) * percentile])
        assert set(batch) <= admitted, step


def test_a_percentile_curriculum_ending_at_zero_is_refused_by_name(index):
    # It used to divide by max_difficulty at the first batch (ZeroDivisionError).
    settings = config(index, total=metric(index, "total", "percentile", lo=0, hi=0, step=1))
    with pytest.raises(DataEfficiencyError, match=r"curriculum_metrics\.total\.max_difficulty = 0"):
        next(iter(DataSampler(settings, SAMPLES, 5, 0, 1)))
    with pytest.raises(DataEfficiencyError, match=r"curriculum_metrics\.total\.min_difficulty = 101"):
        DataSampler(config(index, total=metric(index, "total", "percentile", lo=101, hi=100)), SAMPLES, 5, 0, 1)


def test_two_metrics_are_intersected(index):
    sampler = DataSampler(config(index, length=metric(index, "length", lo=4),
                                 total=metric(index, "total", lo=60, hi=600, total_steps=20, step=20)),
                          SAMPLES, 8, 0, 1)
    data = Tokens().data
    for step, batch in enumerate(global_batches(sampler, 8), start=1):
        assert int(length(data)[batch].max()) <= sampler.current_difficulties["length"]
        assert int(total(data)[batch].max()) <= sampler.current_difficulties["total"], step
    members = [set(c.members.tolist()) for c in sampler.clusters]
    assert all(not (a & b) for i, a in enumerate(members) for b in members[i + 1:])  # clusters are disjoint


def test_custom_schedule_and_the_end_of_the_run(index):
    custom = {**metric(index, "length"), "schedule_type": "custom", "schedule_config": {}}
    sampler = DataSampler(config(index, length=custom), SAMPLES, 50, 0, 1)
    sampler.set_custom_curriculum_learning_schedule({"length": lambda step: 5 if step < 3 else 20})
    with pytest.raises(DataEfficiencyError, match="no curriculum metric named 'size'"):
        sampler.set_custom_curriculum_learning_schedule({"size": lambda step: 1})
    yielded = list(sampler)
    assert len(yielded) == len(sampler) == 9  # 450 samples in micro steps of 50
    assert int(length(Tokens().data)[yielded[0]].max()) <= 5 and sampler.current_difficulties["length"] == 20


def _rank_slices(rank, world, index):
    sampler = DataSampler(config(index, length=metric(index, "length")), SAMPLES, 3, rank, world,
                          gradient_accumulation_steps=2)
    stream = iter(sampler)
    return [next(stream) for _ in range(10)]


def test_global_batch_is_split_over_two_gloo_ranks(index):
    per_rank = run_ranks(_rank_slices, 2, index, timeout=120)
    reference = DataSampler(config(index, length=metric(index, "length")), SAMPLES, 6, 0, 1,
                            gradient_accumulation_steps=2)
    stream = iter(reference)
    for step in range(10):
        whole = next(stream)
        first, second = per_rank[0][step], per_rank[1][step]
        assert len(first) == len(second) == 3 and not set(first) & set(second)
        assert first + second == whole


def _loader(index, workers):
    sampler = DataSampler(config(index, epochs=3, length=metric(index, "length", total_steps=6)), SAMPLES, 4, 0, 1,
                          gradient_accumulation_steps=3)
    return SampledDataLoader(Tokens(), sampler, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_loader_draws_exactly_the_batches_of_an_uninterrupted_one(index, workers):
    original = _loader(index, workers)
    stream = iter(original)
    for _ in range(40):  # past several clusters and reshuffles of the small early clusters
        next(stream)
    state = json.loads(json.dumps(original.state_dict()))  # plain data
    expected = [next(stream) for _ in range(25)]
    resumed = _loader(index, workers)
    resumed.load_state_dict(state)
    got = [next(iter(resumed)) for _ in range(25)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_a_state_for_other_data_is_refused(index, tmp_path):
    sampler = DataSampler(config(index, length=metric(index, "length")), SAMPLES, 4, 0, 1)
    global_batches(sampler, 3)
    state = sampler.state_dict()
    with pytest.raises(DataEfficiencyError, match="global batch size"):
        DataSampler(config(index, length=metric(index, "length")), SAMPLES, 5, 0, 1).load_state_dict(state)
    # Index files of another analysis: the saved clusters no longer come out the same.
    other = Tokens()
    other.data = other.data.flip(0)
    DataAnalyzer(other, batch_size=100, metric_names=["length"], metric_functions=[length],
                 metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64],
                 save_path=str(tmp_path)).run_map_reduce()
    moved = DataSampler(config(tmp_path, length=metric(tmp_path, "length")), SAMPLES, 4, 0, 1)
    state["clusters"][0]["size"] += 1
    with pytest.raises(DataEfficiencyError, match="index files"):
        moved.load_state_dict(state)


def test_a_malformed_state_fails_by_name(index):
    sampler = DataSampler(config(index, length=metric(index, "length")), SAMPLES, 4, 0, 1)
    state = sampler.state_dict()
    del state["clusters"]
    with pytest.raises(DataEfficiencyError, match="malformed"):
        sampler.load_state_dict(state)
    with pytest.raises(DataEfficiencyError, match="version"):
        sampler.load_state_dict({"version": 99})


def test_a_negative_sample_index_is_refused_not_wrapped(tmp_path):
    # A crafted (or signed and corrupted) index_to_sample: -1 used to wrap to the dataset's last sample.
    from dsdata.indexed_dataset import close_mmap_dataset_builder, create_mmap_dataset_builder

    for name, dtype, values in (("m_index_to_sample", "int64", [[3, -1], [0, 1, 2]]),
                                ("m_index_to_metric", "int64", [[1], [2]])):
        builder = create_mmap_dataset_builder(str(tmp_path / name), dtype)
        for item in values:
            builder.add_item(torch.tensor(item))
        close_mmap_dataset_builder(builder, str(tmp_path / name))
    spec = {"index_to_sample_path": str(tmp_path / "m_index_to_sample"),
            "index_to_metric_path": str(tmp_path / "m_index_to_metric"), "difficulty_type": "value",
            "clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 2, "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 2, "difficulty_step": 1}}
    with pytest.raises(DataEfficiencyError, match=r"m_index_to_sample: sample index -1 is outside the dataset of 4"):
        DataSampler(config(tmp_path, m=spec), 4, 1, 0, 1)
