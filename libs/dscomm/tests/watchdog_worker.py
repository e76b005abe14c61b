"""Run by test_watchdog as real processes: every rank starts the watchdog (timeout 3 s; each rank watching
only the next rank, so the others learn of a stop through the verdict) with a process-group timeout of 120 s,
records what it is doing and all-reduces in a loop; the test SIGSTOPs one rank. Prints "ready" once joined.
INIT is a file (a FileStore) or host:port (a TCPStore hosted by rank 0, as a launch without torchrun has).
Usage: watchdog_worker.py RANK WORLD INIT"""

import datetime
import logging
import sys
import time

import torch

import dscomm
from dscomm import backend, watchdog

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dscomm.init_distributed(dist_backend="gloo", init_method=f"tcp://{init}" if ":" in init else f"file://{init}",
                        rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
dscomm.barrier()
backend.set_timeout(datetime.timedelta(seconds=120))  # far beyond the test's patience: only the watchdog ends it
watchdog.WATCHED_PEERS = 1
watchdog.start(timeout_s=3.0)
print("ready", flush=True)
t = torch.ones(1 << 10)
step = 0
while True:
    step += 1
    watchdog.record(f"training step {step} on rank {rank}")
    dscomm.all_reduce(t)
    time.sleep(0.02)
