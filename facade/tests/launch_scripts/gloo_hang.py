"""One rank of a job that never finishes: it joins a gloo group with the others, starts a helper in a
session of its own (as data-loader workers may), then waits. For the tests that kill a supervisor.
Usage: gloo_hang.py [ANY ARGS] OUT_DIR (writes OUT_DIR/started.<rank> once the group is up)."""

import os
import subprocess
import sys
import time

import torch.distributed as dist

out_dir = sys.argv[-1]
dist.init_process_group("gloo")
dist.barrier()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.path.join(out_dir, f"started.{dist.get_rank()}"), "w").close()
time.sleep(600)
