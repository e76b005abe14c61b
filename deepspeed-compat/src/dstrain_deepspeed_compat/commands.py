"""DeepSpeed's commands, served by dstrain, so shell scripts that call them run unchanged:

| command | runs |
|---|---|
| `deepspeed` | dstrain's launcher (`dstrain`; DeepSpeed's flags) |
| `ds_report` | `dstrain-report` |
| `ds_to_universal` | `python -m dstrain.checkpoint.ds_to_universal` (DeepSpeed's arguments), where this dstrain has it |
| `ds_io` | `dsaio-bench`, DeepSpeed's flags translated (`nvme_args.py`) |
| `ds_nvme_tune` | `dsaio-tune`, DeepSpeed's flags translated |

Each refuses, saying so, where a real DeepSpeed is installed beside this package.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys

from .real_deepspeed import refusal
from .startup import DeepSpeedFromDstrain

UNIVERSAL_MODULE = "dstrain.checkpoint.ds_to_universal"


def _refuse_beside_real_deepspeed(command: str) -> None:
    finder = DeepSpeedFromDstrain()
    installed = finder.installed_deepspeed()
    if installed is not None and not finder.shadowing():
        sys.exit(f"{command}: error: {refusal(installed, command)}")


def deepspeed() -> int:
    _refuse_beside_real_deepspeed("deepspeed")
    from dstrain.launcher.cli import main

    return main(sys.argv[1:])


def ds_report() -> int:
    _refuse_beside_real_deepspeed("ds_report")
    from dstrain.report import main

    return main(sys.argv[1:])


def ds_to_universal() -> int:
    _refuse_beside_real_deepspeed("ds_to_universal")
    try:
        present = importlib.util.find_spec(UNIVERSAL_MODULE) is not None
    except ImportError:
        present = False
    if not present:
        sys.exit(f"ds_to_universal: error: this dstrain has no {UNIVERSAL_MODULE} (DeepSpeed's universal-checkpoint "
                 f"converter); upgrade dstrain to a version that has it. Nothing was converted")
    sys.argv[0] = "ds_to_universal"
    runpy.run_module(UNIVERSAL_MODULE, run_name="__main__", alter_sys=True)
    return 0


def ds_io() -> int:
    _refuse_beside_real_deepspeed("ds_io")
    from dsaio.cli import bench

    from .nvme_args import NvmeArgumentError, ds_io_to_dsaio_bench

    try:
        argv = ds_io_to_dsaio_bench(sys.argv[1:])
    except NvmeArgumentError as exc:
        sys.exit(f"ds_io: error: {exc}")
    return bench.main(argv)


def ds_nvme_tune() -> int:
    _refuse_beside_real_deepspeed("ds_nvme_tune")
    from dsaio.cli import tune

    from .nvme_args import NvmeArgumentError, ds_nvme_tune_to_dsaio_tune

    try:
        argv = ds_nvme_tune_to_dsaio_tune(sys.argv[1:])
    except NvmeArgumentError as exc:
        sys.exit(f"ds_nvme_tune: error: {exc}")
    return tune.main(argv)
