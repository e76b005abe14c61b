"""Everything handed to a monitor is written by the time the process ends (issue 28, item 9).

Each test runs a real process that writes to real TensorBoard and CSV files and then ends without
close(): by returning from the function that held the master (the exit hook used to reach it only
through a weak reference, so nothing was written: no CSV, an empty event file), or by SIGTERM, with its
main thread in Python or stuck in native code. The writer threads are given a write interval of an hour,
so nothing reaches a file unless one of these paths writes it.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dsmonitor_readers as readers

from dsmonitor import lifetime

EVENTS = 500
START = f"""
import os, sys, time
import dsconfig, dsmonitor

def make_monitor():
    return dsmonitor.MonitorMaster(
        tensorboard=dsconfig.TensorBoardConfig(enabled=True, output_path="out", job_name="tb"),
        csv_monitor=dsconfig.CSVMonitorConfig(enabled=True, output_path="out", job_name="csv"),
        write_interval=3600.0)  # the writers never wake by themselves: only an ending writes

def write(monitor):
    for step in range({EVENTS}):
        monitor.write_events([("Train/Samples/train_loss", 1.0 / (step + 1), step), ("Train/Samples/lr", 0.5, step)])
"""


def run(folder: Path, body: str, **kwargs) -> subprocess.Popen:
    script = folder / "script.py"
    script.write_text(START + textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script)], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def assert_everything_written(folder: Path) -> None:
    rows = readers.csv_rows(str(folder / "out" / "csv" / "Train_Samples_train_loss.csv"))
    assert rows[0] == ["step", "value"] and len(rows) == EVENTS + 1, f"{len(rows) - 1} of {EVENTS} CSV rows"
    assert [float(r[1]) for r in rows[1:]] == [1.0 / (s + 1) for s in range(EVENTS)]
    scalars = readers.tensorboard_scalars(str(folder / "out" / "tb"))
    assert [s for s, _ in scalars["Train/Samples/train_loss"]] == list(range(EVENTS))
    assert len(scalars["Train/Samples/lr"]) == EVENTS


def wait_ready(proc: subprocess.Popen, folder: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not (folder / "ready").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the script did not get ready"
        time.sleep(0.05)


def test_a_master_dropped_without_close_is_written_at_exit(tmp_path):
    proc = run(tmp_path, """
        def main():
            monitor = make_monitor()
            write(monitor)
        main()  # the master is freed here: no close(), no reference left
        """)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert_everything_written(tmp_path)


def test_a_dropped_master_is_written_while_the_process_goes_on(tmp_path):
    proc = run(tmp_path, """
        import gc, threading
        def main():
            monitor = make_monitor()
            write(monitor)
        main()
        gc.collect()
        def writers():
            return [t for t in threading.enumerate() if t.name in ("dsmonitor-tensorboard", "dsmonitor-csv_monitor")]
        deadline = time.monotonic() + 60
        while writers() and time.monotonic() < deadline:  # they end once they have written everything
            time.sleep(0.05)
        print(len(writers()), flush=True)
        os._exit(0)  # no exit hooks: what is on disk was written when the master was dropped
        """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert out.strip() == "0"
    assert_everything_written(tmp_path)


def test_sigterm_writes_everything_then_ends_the_process_as_sigterm(tmp_path):
    proc = run(tmp_path, """
        monitor = make_monitor()
        write(monitor)
        open("ready", "w").close()
        time.sleep(120)
        """)
    wait_ready(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # still "killed by SIGTERM" for torchrun and the launcher
    assert_everything_written(tmp_path)


def test_sigterm_is_answered_while_the_main_thread_waits_in_native_code(tmp_path):
    """A rank waiting in a collective for a dead peer runs no Python handler; the watcher thread answers."""
    proc = run(tmp_path, """
        from datetime import timedelta
        import torch.distributed as dist
        monitor = make_monitor()
        write(monitor)
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=300))
        open("ready", "w").close()
        store.get("a key nobody sets")  # blocks in C++ for 300 s
        """)
    wait_ready(proc, tmp_path)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    assert time.monotonic() - began < lifetime.SIGTERM_FLUSH_SECONDS + 20
    assert_everything_written(tmp_path)


def test_a_scripts_own_sigterm_handler_is_left_in_charge(tmp_path):
    proc = run(tmp_path, """
        import signal
        def own(signum, frame):
            open("own_handler_ran", "w").close()
            sys.exit(3)  # a normal exit: the exit hooks write the monitors
        signal.signal(signal.SIGTERM, own)
        monitor = make_monitor()
        write(monitor)
        open("ready", "w").close()
        time.sleep(120)
        """)
    wait_ready(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 3 and (tmp_path / "own_handler_ran").exists()
    assert_everything_written(tmp_path)


def test_a_forked_child_dies_of_sigterm_without_touching_the_parents_monitors(tmp_path):
    proc = run(tmp_path, """
        import signal
        monitor = make_monitor()
        write(monitor)
        child = os.fork()
        if child == 0:
            time.sleep(120)
            os._exit(0)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, flush=True)
        time.sleep(1.0)  # the parent's watcher must not have taken the child's signal for its own
        print("parent alive", flush=True)
        """)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert out.split() == ["True", "parent", "alive"]
    assert_everything_written(tmp_path)
    assert os.path.exists(tmp_path / "out" / "csv")
