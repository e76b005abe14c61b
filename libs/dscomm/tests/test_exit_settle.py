"""dscomm's exit function waits, giving up the GIL, while another thread of the process is runnable (a gloo
worker about to free a tensor's Python object), and only then lets the interpreter finalize."""

import subprocess
import sys
import threading
import time

import torch

from dscomm.exit_settle import settle_threads


def test_idle_threads_are_not_waited_for():
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait)
    sleeper.start()
    try:
        assert settle_threads(limit_s=5.0) < 2.0  # generous for a loaded machine: idle is a few ms
    finally:
        stop.set()
        sleeper.join()


def test_a_runnable_thread_is_waited_for_until_it_is_done():
    x = torch.randn(256, 256)
    began = time.monotonic()

    def busy():  # matmuls release the GIL: the thread runs (state R) while the main thread waits
        while time.monotonic() - began < 0.5:
            x @ x

    worker = threading.Thread(target=busy)
    worker.start()
    waited = settle_threads(limit_s=10.0)
    assert not worker.is_alive() or time.monotonic() - began >= 0.45, waited
    worker.join()


def test_the_wait_is_bounded():
    stop = threading.Event()
    x = torch.randn(256, 256)

    def busy():
        while not stop.is_set():
            x @ x

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        assert 0.2 <= settle_threads(limit_s=0.2) < 3.0
    finally:
        stop.set()
        worker.join()


def test_importing_dscomm_registers_it_at_exit():
    code = ("import atexit, dscomm, dscomm.exit_settle as s\n"
            "import torch.distributed\n"
            "s.settle_threads = lambda limit_s=1.0: print('settled')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "settled" in run.stdout, run.stderr
