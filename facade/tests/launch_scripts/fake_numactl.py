"""A stand-in for `numactl --physcpubind=LIST [--membind=N] -- COMMAND...` in launcher tests, for machines
without numactl: pins itself to LIST with sched_setaffinity (as numactl does), appends its arguments
as one JSON line to $FAKE_NUMACTL_LOG and runs COMMAND in its place."""

import json
import os
import sys


def cores(text: str) -> set[int]:
    found: set[int] = set()
    for item in text.split(","):
        first, _, last = item.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def main(args: list[str]) -> None:
    with open(os.environ["FAKE_NUMACTL_LOG"], "a") as log:
        log.write(json.dumps(args) + "\n")
    split = args.index("--")
    for option in args[:split]:
        if option.startswith("--physcpubind="):
            os.sched_setaffinity(0, cores(option.split("=", 1)[1]))
    os.execv(args[split + 1], args[split + 1 :])


if __name__ == "__main__":
    main(sys.argv[1:])
