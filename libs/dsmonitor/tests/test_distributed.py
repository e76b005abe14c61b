"""Two real gloo ranks: only rank 0 writes, and timers reduce across ranks."""

import os
import traceback

import pytest
import torch.multiprocessing as multiprocessing

TIMEOUT_S = 90


def _rank_main(rank, world, init_file, out_dir, errors):
    try:
        import time

        import torch.distributed as dist

        import dsconfig
        from dsmonitor import MonitorMaster, SynchronizedWallClockTimer

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        cfg = dsconfig.CSVMonitorConfig(enabled=True, output_path=out_dir, job_name="job")
        with MonitorMaster(csv_monitor=cfg) as monitor:  # rank from the process group
            assert monitor.enabled == (rank == 0)
            monitor.write_events([("Train/Samples/lr", float(rank), 1)])
        timers = SynchronizedWallClockTimer()
        timers("fwd").start()
        time.sleep(0.05 * (rank + 1))
        timers("fwd").stop()
        slowest = timers.elapsed_global(["fwd"], reduce="max", reset=False)["fwd"]
        fastest = timers.elapsed_global(["fwd"], reduce="min")["fwd"]
        assert slowest >= 100 and 50 <= fastest < 100, (slowest, fastest)
        dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def test_two_ranks_only_rank0_writes_and_timers_reduce(tmp_path):
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, str(tmp_path / "init"), str(tmp_path), errors))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT_S)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    if hung:
        pytest.fail(f"{len(hung)} rank(s) still running after {TIMEOUT_S} s")
    problems = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert all(p.exitcode == 0 for p in procs), "\n".join(problems)
    with open(os.path.join(tmp_path, "job", "Train_Samples_lr.csv")) as f:
        assert f.read().splitlines() == ["step,value", "1,0.0"]  # rank 1's 1.0 never written
