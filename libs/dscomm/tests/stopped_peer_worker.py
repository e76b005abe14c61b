"""Run by test_failures as two real processes: rank 1 gets stopped (SIGSTOP); rank 0's timeout CommError
goes out of the script, as it would out of a training script. At exit rank 0 prints its native threads.
Usage: stopped_peer_worker.py RANK INIT_FILE"""

import atexit
import datetime
import glob
import sys
import time
from pathlib import Path

import torch

import dscomm
from dscomm import backend


def threads_at_exit():
    names = sorted(Path(path).read_text().strip() for path in glob.glob("/proc/self/task/*/comm"))
    print("threads at exit:", " ".join(names), flush=True)


rank, init_file = int(sys.argv[1]), sys.argv[2]
dscomm.init_distributed(dist_backend="gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
dscomm.barrier()
backend.set_timeout(datetime.timedelta(seconds=3))  # joining had a minute: a loaded machine starts ranks late
print("ready", flush=True)
if rank == 1:
    time.sleep(600)
atexit.register(threads_at_exit)
t = torch.ones(1 << 16)
while True:
    dscomm.all_reduce(t)
    time.sleep(0.01)
