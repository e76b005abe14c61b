"""see_memory_usage: one line on rank 0 when forced, from /proc (and CUDA's counters where CUDA runs)."""

import logging

from dsmonitor import see_memory_usage


def test_forced_report_on_rank_0_only(monkeypatch, caplog):
    monkeypatch.setenv("RANK", "0")
    assert see_memory_usage("quiet") is None  # not forced: nothing, as DeepSpeed's
    with caplog.at_level(logging.INFO, logger="dsmonitor"):
        line = see_memory_usage("after init", force=True)
    assert line.startswith("after init | CPU used ") and " GB (" in line and "| RSS " in line
    assert line in caplog.text
    used, total = (float(x) for x in line.split("CPU used ")[1].split(" GB")[0].split(" / "))
    assert 0 < used <= total
    monkeypatch.setenv("RANK", "1")
    assert see_memory_usage("elsewhere", force=True) is None
