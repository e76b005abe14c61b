"""Two real gloo ranks: only rank 0 writes, and timers reduce across ranks.

dsmonitor sits below dscomm, so its run_ranks is not available here; the few lines below do the same
for two ranks, including its retry of a rendezvous that a loaded machine broke.
"""

import datetime
import os
import queue
import time
import traceback

import torch.multiprocessing as multiprocessing

TIMEOUT_S = 120
RENDEZVOUS_ATTEMPTS = 3


def _rank_main(rank, world, init_file, out_dir, results):
    stage = "rendezvous"
    try:
        import torch
        import torch.distributed as dist

        import dsconfig
        from dsmonitor import MonitorMaster, SynchronizedWallClockTimer

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        dist.barrier()  # both ranks connected: nothing below runs twice if a rendezvous is retried
        stage = "error"
        cfg = dsconfig.CSVMonitorConfig(enabled=True, output_path=out_dir, job_name="job")
        with MonitorMaster(csv_monitor=cfg) as monitor:  # rank from the process group
            assert monitor.enabled == (rank == 0)
            monitor.write_events([("Train/Samples/lr", float(rank), 1)])
        timers = SynchronizedWallClockTimer()
        timers("fwd").start()
        time.sleep(0.05 * (rank + 1))
        timers("fwd").stop()
        mine = timers("fwd").elapsed(reset=False)
        every = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, torch.tensor([mine], dtype=torch.float64))
        slowest = timers.elapsed_global(["fwd"], reduce="max", reset=False)["fwd"]
        fastest = timers.elapsed_global(["fwd"], reduce="min")["fwd"]
        # Each rank's own figure is load-dependent; the reduction over them is not.
        assert mine >= 50 * (rank + 1), mine
        assert (slowest, fastest) == (max(t.item() for t in every), min(t.item() for t in every)), every
        assert timers("fwd").elapsed() == 0.0  # reduce="min" reset it
        dist.destroy_process_group()
        results.put((rank, "ok", ""))
    except BaseException:
        results.put((rank, stage, f"rank {rank}: {traceback.format_exc()}"))


def _run_two_ranks(tmp_path):
    """Each rank's (status, text); a rendezvous that fails is tried again with a fresh init file."""
    ctx = multiprocessing.get_context("fork")
    deadline = time.monotonic() + TIMEOUT_S
    for attempt in range(RENDEZVOUS_ATTEMPTS):
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(r, 2, str(tmp_path / f"init{attempt}"), str(tmp_path), results))
                 for r in range(2)]
        for p in procs:
            p.start()
        got = {}
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                rank, status, text = results.get(timeout=0.2)
                got[rank] = (status, text)
            except queue.Empty:
                if any(not p.is_alive() and r not in got for r, p in enumerate(procs)):
                    time.sleep(0.5)  # its report may still be in the pipe
                    if results.empty():
                        break
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        if not any(status == "rendezvous" for status, _ in got.values()) or time.monotonic() > deadline:
            return got, procs
    return got, procs


def test_two_ranks_only_rank0_writes_and_timers_reduce(tmp_path):
    got, procs = _run_two_ranks(tmp_path)
    problems = "\n".join(text for _, text in got.values() if text)
    assert [got.get(r, ("no report", ""))[0] for r in range(2)] == ["ok", "ok"], problems or \
        f"exit codes {[p.exitcode for p in procs]} (none reported within {TIMEOUT_S} s)"
    with open(os.path.join(tmp_path, "job", "Train_Samples_lr.csv")) as f:
        assert f.read().splitlines() == ["step,value", "1,0.0"]  # rank 1's 1.0 never written
