"""The data analyzer: the same file bytes for 1 worker x 1 thread, 2 x 3 and a 2-rank map-reduce, with
ragged batches; contents checked by hand through the format-description reader."""

import filecmp

import mmap_format
import numpy as np
import pytest
import torch

from dscomm.testing import run_ranks
from dsdata import DataAnalyzer, DataEfficiencyError, data_analyzer

VOCAB, SEQ, SAMPLES = 50, 24, 450
FILES = ("length/length_sample_to_metric", "length/length_index_to_sample", "length/length_index_to_metric",
         "length/length_index_to_sample_percentile_merged", "total/total_sample_to_metric",
         "total/total_index_to_sample", "total/total_index_to_metric",
         "total/total_index_to_sample_percentile_merged", "histogram/histogram_metric_value")


class Tokens(torch.utils.data.Dataset):
    """Samples of 1..20 non-zero tokens, padded with zeros to SEQ."""

    def __init__(self):
        gen = torch.Generator().manual_seed(3)
        lengths = torch.randint(1, 21, (SAMPLES,), generator=gen)
        self.data = torch.randint(1, VOCAB, (SAMPLES, SEQ), generator=gen)
        self.data[torch.arange(SEQ) >= lengths[:, None]] = 0

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        return self.data[index]


def length(batch):
    return (batch != 0).sum(dim=1)


def total(batch):
    return batch.sum(dim=1)


def histogram(batch):
    return torch.bincount(batch.reshape(-1), minlength=VOCAB)


def analyzer(save_path, **kwargs):
    return DataAnalyzer(Tokens(), batch_size=16, metric_names=["length", "total", "histogram"],
                        metric_functions=[length, total, histogram],
                        metric_types=["single_value_per_sample", "single_value_per_sample",
                                      "accumulate_value_over_samples"],
                        metric_dtypes=[torch.int64, np.int64, torch.int64], save_path=str(save_path), **kwargs)


def run(save_path, workers, threads):
    for worker in range(workers):
        analyzer(save_path, num_workers=workers, worker_id=worker, num_threads=threads).run_map()
    analyzer(save_path, num_workers=workers, num_threads=threads).run_reduce()


def _map_reduce_rank(rank, world, save_path):
    analyzer(save_path, num_workers=world, worker_id=rank, num_threads=2).run_map_reduce()
    return True


def test_files_are_identical_for_any_split_and_hold_the_index(tmp_path):
    run(tmp_path / "one", 1, 1)
    run(tmp_path / "six", 2, 3)
    run_ranks(_map_reduce_rank, 2, str(tmp_path / "ranks"), timeout=240)
    for name in FILES:
        for other in ("six", "ranks"):
            for suffix in (".bin", ".idx"):
                assert filecmp.cmp(tmp_path / "one" / f"{name}{suffix}", tmp_path / other / f"{name}{suffix}",
                                   shallow=False), (other, name, suffix)

    data = Tokens().data
    for metric, values in (("length", length(data)), ("total", total(data))):
        values = values.tolist()
        _, sample_to_metric, docs = mmap_format.read(tmp_path / "one" / metric / f"{metric}_sample_to_metric")
        assert sample_to_metric == [[v] for v in values] and docs == [0, SAMPLES]
        distinct = sorted(set(values))
        dtype, index_to_metric, _ = mmap_format.read(tmp_path / "one" / metric / f"{metric}_index_to_metric")
        assert index_to_metric == [[v] for v in distinct]
        assert dtype == (np.uint8 if max(values) < 256 else np.uint16)
        sample_dtype, index_to_sample, _ = mmap_format.read(tmp_path / "one" / metric / f"{metric}_index_to_sample")
        rows = [[i for i, v in enumerate(values) if v == value] for value in distinct]
        assert index_to_sample == rows and sample_dtype == np.uint16  # 450 samples need 16 bits
        _, merged, _ = mmap_format.read(tmp_path / "one" / metric / f"{metric}_index_to_sample_percentile_merged")
        step = max(1, len(distinct) // 100)
        assert merged == [[s for row in rows[i:i + step] for s in row] for i in range(0, len(rows), step)]
    assert len(set(total(data).tolist())) > 200  # so the merged index really merges
    _, (counts,), _ = mmap_format.read(tmp_path / "one" / "histogram" / "histogram_metric_value")
    assert counts == torch.bincount(data.reshape(-1), minlength=VOCAB).tolist()


def test_sample_indices_and_a_progress_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data_analyzer, "PROGRESS_INTERVAL_S", 0.0)
    order = list(range(SAMPLES))[::-1]
    DataAnalyzer(Tokens(), batch_size=64, metric_names=["length"], metric_functions=[length],
                 metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64], save_path=str(tmp_path),
                 sample_indices=order).run_map_reduce()
    values = length(Tokens().data).tolist()
    _, index_to_sample, _ = mmap_format.read(tmp_path / "length" / "length_index_to_sample")
    _, index_to_metric, _ = mmap_format.read(tmp_path / "length" / "length_index_to_metric")
    # Position p analyzed sample p's data and is recorded as sample order[p].
    for (value,), samples in zip(index_to_metric, index_to_sample):
        assert samples == [order[p] for p, v in enumerate(values) if v == value]
    err = capsys.readouterr().err
    assert "worker 0 thread 0:" in err and "samples/s, about" in err and "left" in err


def test_bad_metric_output_is_named(tmp_path):
    bad = DataAnalyzer(Tokens(), batch_size=8, metric_names=["length"], metric_functions=[lambda b: length(b).int()],
                       metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64], save_path=str(tmp_path))
    with pytest.raises(DataEfficiencyError, match=r"'length'.*int32.*int64"):
        bad.run_map()
    with pytest.raises(DataEfficiencyError, match="metric_type"):
        DataAnalyzer(Tokens(), metric_names=["x"], metric_functions=[length], metric_types=["per_token"],
                     metric_dtypes=[torch.int64])
    with pytest.raises(DataEfficiencyError, match="did not finish"):
        analyzer(tmp_path / "none", num_workers=2).run_reduce()


def _distributed_rank(rank, world, save_path):
    from dsdata import DistributedDataAnalyzer

    group = torch.distributed.new_group(list(range(world)))
    DistributedDataAnalyzer(Tokens(), num_workers=5, worker_id=3,  # the group's size and rank win
                            batch_size=16, metric_names=["length", "total", "histogram"],
                            metric_functions=[length, total, histogram],
                            metric_types=["single_value_per_sample", "single_value_per_sample",
                                          "accumulate_value_over_samples"],
                            save_path=save_path, device="cpu", comm_group=group).run_map_reduce()
    try:
        DistributedDataAnalyzer(Tokens(), metric_names=["mean"], metric_functions=[lambda b: b.float().mean(1)],
                                metric_types=["single_value_per_sample"], save_path=save_path + "-float",
                                comm_group=group).run_map_reduce()
    except DataEfficiencyError as exc:
        return str(exc)
    return None


def test_distributed_analyzer_over_a_group_writes_the_same_files(tmp_path):
    run(tmp_path / "one", 1, 1)
    refusals = run_ranks(_distributed_rank, 2, str(tmp_path / "group"), timeout=240)
    for name in FILES:
        for suffix in (".bin", ".idx"):
            assert filecmp.cmp(tmp_path / "one" / f"{name}{suffix}", tmp_path / "group" / f"{name}{suffix}",
                               shallow=False), (name, suffix)
    assert all("'mean'" in why and "integer" in why for why in refusals)
