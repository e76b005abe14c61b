"""One rank that never finishes (it also starts a helper in a session of its own, as data-loader
workers may), for the tests that stop a job. Rank $DIE_RANK exits with code 7 once every rank runs.
Usage: hang.py OUT_DIR"""

import os
import subprocess
import sys
import time

out_dir, rank, world = sys.argv[-1], os.environ["RANK"], int(os.environ["WORLD_SIZE"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.path.join(out_dir, f"started.{rank}"), "w").close()
if rank == os.environ.get("DIE_RANK"):
    deadline = time.monotonic() + 60
    while len([n for n in os.listdir(out_dir) if n.startswith("started.")]) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(7)
time.sleep(600)
