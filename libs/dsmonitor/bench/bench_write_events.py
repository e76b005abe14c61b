"""Caller-side cost of MonitorMaster.write_events with all four backends on, side by side with
a call that does nothing and with writing synchronously (what DeepSpeed's monitors do).

    flock /tmp/dstrain-bench.lock python libs/dsmonitor/bench/bench_write_events.py

W&B and Comet run offline (local files), so no key or network is needed.
"""

import argparse
import os
import statistics
import tempfile
import time

CALLS = 2000
EVENTS_PER_CALL = 8  # the reference's automatic events: loss, lr, loss_scale, five timings


def offline_env(root):
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=root, WANDB_SILENT="true",
                      COMET_OFFLINE_DIRECTORY=os.path.join(root, "comet"), COMET_ERROR_TRACKING_ENABLE="false",
                      COMET_AUTO_LOG_ENV_DETAILS="false", COMET_AUTO_LOG_GIT_METADATA="false",
                      COMET_AUTO_LOG_GIT_PATCH="false", COMET_AUTO_LOG_CO2="false")


def configs(root):
    import dsconfig

    return dict(
        tensorboard=dsconfig.TensorBoardConfig(enabled=True, output_path=root, job_name="tb"),
        wandb=dsconfig.WandbConfig(enabled=True),
        comet=dsconfig.CometConfig(enabled=True, online=False, samples_log_interval=1),
        csv_monitor=dsconfig.CSVMonitorConfig(enabled=True, output_path=root, job_name="csv"),
    )


def batch(step):
    return [(f"Train/Samples/event_{i}", 0.5 + step * 1e-3 + i, step) for i in range(EVENTS_PER_CALL)]


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def per_call_us(write, pace_s, pause):
    """Median and p99 of one call's wall time, in µs; pace_s of 'training' between calls."""
    times = []
    for step in range(CALLS):
        events = batch(step)
        t0 = time.perf_counter_ns()
        write(events)
        times.append((time.perf_counter_ns() - t0) / 1e3)
        if pace_s:
            pause(pace_s)
    times.sort()
    return statistics.median(times), times[int(0.99 * len(times))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pace-ms", type=float, default=1.0, help="simulated training time between calls")
    parser.add_argument("--sleep", action="store_true",
                        help="sleep between calls (a loop blocked on a device) instead of computing (CPU busy)")
    args = parser.parse_args()
    pace = args.pace_ms / 1e3
    pause = time.sleep if args.sleep else busy
    from dsmonitor import MonitorMaster
    from dsmonitor.backends import CometMonitor, CSVMonitor, TensorBoardMonitor, WandbMonitor

    rows = {}
    with tempfile.TemporaryDirectory() as root:
        offline_env(root)
        cfg = configs(root)

        def nothing(events):
            pass

        rows["plain loop (call that does nothing)"] = per_call_us(nothing, pace, pause)

        sync_backends = [TensorBoardMonitor(cfg["tensorboard"], subdir="sync"), WandbMonitor(cfg["wandb"]),
                         CometMonitor(cfg["comet"]), CSVMonitor(cfg["csv_monitor"], subdir="sync")]
        tb_writer = sync_backends[0]._writer

        def tb_direct(events):
            for name, value, step in events:
                tb_writer.add_scalar(name, value, step)

        rows["SummaryWriter.add_scalar direct (TB only)"] = per_call_us(tb_direct, pace, pause)

        def synchronous(events):
            for backend in sync_backends:
                backend.write_events(events)

        rows["synchronous, 4 backends (DeepSpeed-style)"] = per_call_us(synchronous, pace, pause)
        for backend in sync_backends:
            backend.close()

        monitor = MonitorMaster(**cfg)
        rows["dsmonitor write_events, 4 backends"] = per_call_us(monitor.write_events, pace, pause)
        t0 = time.perf_counter()
        monitor.close()
        close_s = time.perf_counter() - t0
        dropped = sum(monitor.dropped_events.values())

    anchor = rows["dsmonitor write_events, 4 backends"][0]
    print(f"{CALLS} calls x {EVENTS_PER_CALL} events, {pace * 1e3:g} ms of {'sleep' if args.sleep else 'busy CPU'} "
          f"between calls")
    print(f"{'caller-side cost per call':45s} {'median µs':>10s} {'p99 µs':>10s} {'vs dsmonitor':>13s}")
    for name, (median, p99) in rows.items():
        print(f"{name:45s} {median:10.2f} {p99:10.2f} {median / anchor:12.2f}x")
    print(f"dsmonitor: dropped events {dropped}, close() took {close_s:.2f} s (flushes and ends all runs)")


if __name__ == "__main__":
    main()
