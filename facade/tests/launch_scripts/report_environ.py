"""One rank of a launcher test, without torch: write its script path, argv and whole environment to OUT_DIR/rank<R>.json."""

import json
import os
import sys

out_dir = sys.argv[-1]
seen = {"script": sys.argv[0], "argv": sys.argv[1:], "environ": dict(os.environ)}
with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
