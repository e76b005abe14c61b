"""One rank of a launcher test: all-reduce its rank+1 over gloo and write what it saw to OUT_DIR/rank<R>.json."""

import json
import os
import sys

import torch
import torch.distributed as dist

out_dir = sys.argv[-1]
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
seen = {"argv": sys.argv[1:], "sum": value.item(), "rank": dist.get_rank(), "world": dist.get_world_size(),
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}}
with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(seen, f)
print(f"rank {dist.get_rank()}: all_reduce sum {value.item()}", flush=True)
dist.destroy_process_group()
