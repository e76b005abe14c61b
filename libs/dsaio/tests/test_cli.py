"""The command-line tools run end to end on a small size."""

from __future__ import annotations

from dsaio.cli import bench, tune


def test_dsaio_bench_prints_a_median(tmp_path, capsys):
    assert bench.main(["--path", str(tmp_path), "--size", "4M", "--op", "write", "--loops", "2"]) == 0
    assert bench.main(["--path", str(tmp_path), "--size", "4M", "--op", "read", "--loops", "2", "--engine", "python"]) == 0
    out = capsys.readouterr()
    assert "median" in out.out and "run 2/2" in out.err


def test_dsaio_tune_prints_a_table_and_config_snippets(tmp_path, capsys):
    assert tune.main(["--path", str(tmp_path), "--quick", "--io_size", "2M", "--engines", "threads"]) == 0
    out = capsys.readouterr().out
    assert "best read" in out and "best write" in out and '"aio": {' in out and '"queue_depth"' in out
    assert not list(tmp_path.iterdir())  # the scratch file is removed
