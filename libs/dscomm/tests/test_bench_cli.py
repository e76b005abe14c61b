"""`dscomm-bench` runs end to end (figures are for BENCHMARKS.md, not asserted here)."""

import subprocess
import sys

import pytest

from dscomm.bench import parse_size


def test_bench_command_prints_every_op_and_size():
    out = subprocess.run([sys.executable, "-m", "dscomm.bench", "--world-size", "2", "--min-size", "1KiB",
                          "--max-size", "4KiB", "--trials", "2", "--warmup", "1", "--log"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.split() and line.split()[0] in
            ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")]
    assert {(r[0], r[1] + r[2]) for r in rows} == {(op, size) for op in
                                                   ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                    "broadcast") for size in ("1KiB", "4KiB")}


@pytest.mark.parametrize(("text", "value"), [("1KiB", 1024), ("64MiB", 64 << 20), ("4096", 4096), ("2kb", 2048)])
def test_sizes(text, value):
    assert parse_size(text) == value


def test_bad_size_is_named():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="'12 parsecs' is not a size"):
        parse_size("12 parsecs")
