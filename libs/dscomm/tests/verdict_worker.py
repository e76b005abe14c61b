"""Run by test_watchdog as real processes (2 ranks, FileStore): both start the watchdog with a long timeout; rank 1
writes a verdict naming a stall (as a rank whose watchdog named a stopped peer does) and exits at once, as that rank
does; rank 0's all_reduce then fails because its peer left. Rank 0 must end on the verdict (its on_stall prints it),
not on the aftermath. Usage: verdict_worker.py RANK INIT"""

import datetime
import os
import sys

import torch

import dscomm
from dscomm import watchdog

rank, init = int(sys.argv[1]), sys.argv[2]
dscomm.init_distributed(dist_backend="gloo", init_method=f"file://{init}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
named = []
dog = watchdog.start(timeout_s=600.0, on_stall=named.append)
dscomm.barrier()
if rank == 1:
    dog.store.set(dog.key("verdict"), "rank 7 (process 1 on a host) stopped answering")
    os._exit(75)
try:
    for _ in range(200):
        dscomm.all_reduce(torch.ones(4))
except dscomm.CommError as exc:
    print(f"verdict: {named}", flush=True)
    print(f"error: {exc}", flush=True)
