"""One rank of a launcher test, without torch: write argv, the cores it may run on and OMP_NUM_THREADS
to OUT_DIR/rank<R>.json."""

import json
import os
import sys

out_dir = sys.argv[-1]
seen = {"argv": sys.argv[1:], "cores": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS")}
with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
