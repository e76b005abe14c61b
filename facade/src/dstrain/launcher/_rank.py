"""Runs one rank's training script the way DeepSpeed's launcher does, inside torchrun.

    python _rank.py [--no_local_rank] [--module] SCRIPT_OR_MODULE [ARGS...]

torchrun sets LOCAL_RANK, RANK and WORLD_SIZE; DeepSpeed scripts also expect `--local_rank=N` as
their first argument, which torchrun does not pass, so this wrapper inserts it (unless
`--no_local_rank`) and then runs the script as `__main__`, as `python SCRIPT ARGS` would. It is
run by path and imports nothing from dstrain but the small `dstrain.as_deepspeed` hook (where no real
DeepSpeed is installed and DSTRAIN_DEEPSPEED_ALIAS is not "0"), so an unchanged DeepSpeed script's
`import deepspeed` runs on dstrain.
"""

import importlib.util
import os
import runpy
import sys

ALIAS_ENV = "DSTRAIN_DEEPSPEED_ALIAS"  # "0" (the launcher's --no_deepspeed_alias): leave `import deepspeed` alone


def main() -> None:
    args = sys.argv[1:]
    local_rank, module = True, False
    while args and args[0] in ("--no_local_rank", "--module"):
        flag = args.pop(0)
        local_rank = local_rank and flag != "--no_local_rank"
        module = module or flag == "--module"
    target, rest = args[0], args[1:]
    # An unchanged DeepSpeed script imports `deepspeed`: resolve it to dstrain where no real DeepSpeed is installed.
    if os.environ.get(ALIAS_ENV, "1") != "0" and importlib.util.find_spec("deepspeed") is None:
        import dstrain.as_deepspeed  # noqa: F401
    if local_rank:
        rest = [f"--local_rank={os.environ.get('LOCAL_RANK', '0')}", *rest]
    if module:
        sys.argv = [target, *rest]
        sys.path[0] = os.getcwd()  # as `python -m` does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python SCRIPT` does
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
