"""One rank of a launcher test, without torch (starts in milliseconds): write argv and env to OUT_DIR/rank<R>.json."""

import json
import os
import sys

out_dir = sys.argv[-1]
seen = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}}
with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
