"""One rank of one of several jobs started at once on this machine: all-reduce over gloo within the job,
then wait until every rank of every job has started, so the jobs' rendezvous surely overlap.
Usage: meet.py JOB_NAME EXPECTED_RANKS_OF_ALL_JOBS OUT_DIR; writes OUT_DIR/JOB_NAME.rank<R>.json."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

name, expected, out_dir = sys.argv[-3], int(sys.argv[-2]), sys.argv[-1]
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
open(os.path.join(out_dir, f"started.{name}.{dist.get_rank()}"), "w").close()
deadline = time.monotonic() + 120
while len([n for n in os.listdir(out_dir) if n.startswith("started.")]) < expected:
    if time.monotonic() > deadline:
        sys.exit(f"rank {dist.get_rank()} of {name}: the other job's ranks never started")
    time.sleep(0.05)
with open(os.path.join(out_dir, f"{name}.rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"sum": value.item(), "world": dist.get_world_size(), "port": os.environ["MASTER_PORT"]}, f)
dist.destroy_process_group()
