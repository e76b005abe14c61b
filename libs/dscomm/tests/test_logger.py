"""The comms logger: what is recorded, sizes and bandwidths, verbose and debug, and log_summary."""

import contextlib
import io

import pytest
import torch

import dscomm
from dscomm.bandwidth import bandwidths
from dscomm.testing import run_ranks
from dsconfig import CommsLoggerConfig


def logged_ops(rank, world):
    dscomm.configure(CommsLoggerConfig(enabled=True))
    for _ in range(3):
        dscomm.all_reduce(torch.ones(256))                       # 1 KiB
    dscomm.all_reduce(torch.ones(1024), log_name="grads")        # 4 KiB, own name
    dscomm.all_gather_into_tensor(torch.empty(64 * world), torch.ones(64))
    dscomm.reduce_scatter_tensor(torch.empty(64), torch.ones(64 * world))
    dscomm.broadcast(torch.ones(16), src=0)
    dscomm.all_reduce(torch.ones(256), async_op=True).wait()
    log = dscomm.get_comms_log()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        gathered = dscomm.log_summary(show_straggler=True, return_dict=True)
    dscomm.configure(enabled=False)
    dscomm.all_reduce(torch.ones(8))                                   # not recorded
    return log, gathered, buffer.getvalue(), len(dscomm.get_comms_log()["all_reduce"])


def test_counts_sizes_and_bandwidth_formulas():
    world = 4
    results = run_ranks(logged_ops, world, timeout=60)
    log, gathered, printed, after_off = results[0]
    assert set(log) == {"all_reduce", "grads", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"}
    assert log["all_reduce"][1024]["count"] == 4 and after_off == 1  # sizes 1024 B: 3 sync + 1 async
    assert log["grads"][4096]["count"] == 1
    assert list(log["all_gather_into_tensor"]) == [64 * 4 * world]   # the gathered (output) size
    assert list(log["reduce_scatter_tensor"]) == [64 * 4 * world]    # the input size
    assert list(log["broadcast"]) == [64]
    for sizes in log.values():
        for nbytes, entry in sizes.items():
            algbw, busbw = bandwidths(entry["op"], nbytes, entry["avg_latency_ms"], world)
            assert entry["algbw_GBps"] == pytest.approx(algbw) and entry["busbw_GBps"] == pytest.approx(busbw)
            assert entry["group_size"] == world and entry["avg_latency_ms"] > 0
    ar = log["all_reduce"][1024]
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"] * 2 * (world - 1) / world)
    ag = log["all_gather_into_tensor"][1024]
    assert ag["busbw_GBps"] == pytest.approx(ag["algbw_GBps"] * (world - 1) / world)
    # log_summary: gathered from every rank, printed on rank 0 only.
    assert gathered["summary"]["all_reduce"][1024]["ranks"] == world
    assert gathered["straggler_analysis"]["all_reduce"][1024]["straggler_ms"] >= 0
    assert "all_reduce" in printed and "busbw (GB/s)" in printed and "straggler" in printed
    assert all(r[2] == "" for r in results[1:])


def subgroup_busbw(rank, world):
    dscomm.configure(enabled=True)
    group = torch.distributed.new_group([0, 1])
    if rank in (0, 1):
        dscomm.all_reduce(torch.ones(1000), group=group)
    log = dscomm.get_comms_log()
    dscomm.configure(enabled=False)
    return log


def test_subgroup_bandwidth_uses_the_group_size_not_the_world():
    log = run_ranks(subgroup_busbw, 4, timeout=60)[0]
    entry = log["all_reduce"][4000]
    assert entry["group_size"] == 2
    assert entry["busbw_GBps"] == pytest.approx(entry["algbw_GBps"] * 1.0)  # 2(n-1)/n with n = 2


def selected_ops_verbose_and_debug(rank, world):
    dscomm.configure(enabled=True, prof_all=False, prof_ops=["all_gather_into_tensor"], verbose=True, debug=True)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        dscomm.all_reduce(torch.ones(4))                                        # not selected
        dscomm.all_reduce(torch.ones(4), prof=True)                             # selected by prof=True
        dscomm.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4))    # selected by prof_ops
    log = dscomm.get_comms_log()
    dscomm.configure(enabled=False, prof_all=True, prof_ops=[], verbose=False, debug=False)
    return sorted(log), buffer.getvalue()


def test_prof_ops_verbose_and_debug():
    names, printed = run_ranks(selected_ops_verbose_and_debug, 2, timeout=60)[0]
    assert len(names) == 2
    assert all("[caller: selected_ops_verbose_and_debug (test_logger.py:" in name for name in names)
    assert printed.count("dscomm: ") == 2 and "GB/s" in printed


def test_unknown_op_is_a_clear_error_not_an_exit():
    with pytest.raises(dscomm.CommError, match="unknown ops \\['allreduce'\\]; valid: all_gather"):
        dscomm.configure(enabled=True, prof_ops=["allreduce"])
    assert dscomm.comms_logger_settings()["prof_ops"] == []


def test_configure_from_a_whole_config():
    import dsconfig

    dscomm.configure(dsconfig.load({"comms_logger": {"enabled": True, "prof_all": False, "prof_ops": ["broadcast"]}}))
    assert dscomm.comms_logger_settings() == {"enabled": True, "verbose": False, "prof_all": False, "debug": False,
                                              "prof_ops": ["broadcast"]}
    dscomm.configure(enabled=False, prof_all=True, prof_ops=[])
