"""DeepSpeed's `ds_io` and `ds_nvme_tune` flags, translated to dsaio's `dsaio-bench` and `dsaio-tune`.

Each DeepSpeed flag either has a dsaio counterpart (same meaning, DeepSpeed's default kept where dsaio's
differs) or is refused by name with what to do instead: a measurement that silently ignored `--gpu` would
report the wrong thing.
"""

from __future__ import annotations

import argparse


class NvmeArgumentError(ValueError):
    """A DeepSpeed flag that dsaio's tools cannot honour."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print and exit: raise, so the caller words it
        raise NvmeArgumentError(message)


def _refuse(parser: argparse.ArgumentParser, args: argparse.Namespace, reasons: dict[str, str], tool: str) -> None:
    """Every flag of `reasons` given a value other than its default is an error, all named at once."""
    given = [flag for flag in reasons if getattr(args, flag) != parser.get_default(flag)]
    if given:
        raise NvmeArgumentError("; ".join(f"--{flag} is not supported by dstrain's {tool}: {reasons[flag]}"
                                          for flag in given))


_DS_IO_UNSUPPORTED = {
    "folder_to_device_mapping": "give one --folder",
    "multi_process": "run one ds_io per process",
    "gpu": "dsaio moves host memory (GPU buffers go through torch's pinned copies in dszero)",
    "use_gds": "dsaio has no GPUDirect Storage engine",
    "slow_bounce_buffer": "it measures GPU bounce buffers, which dsaio does not use",
    "torch_legacy_save": "dsaio-bench measures the aio handle only",
    "use_accelerator_pin_memory": "dsaio pins host buffers itself",
    "validate": "dsaio verifies its transfers in its tests, not in the benchmark",
    "include_warmup_time": "dsaio-bench reports the median of its runs",
    "different_file_each_iteration": "dsaio-bench reuses one file",
}
_DS_IO_ENGINES = ("aio_handle", "aio_basic")  # DeepSpeed's libaio engines: dsaio's own (the fastest that works here)


def ds_io_to_dsaio_bench(argv: list[str]) -> list[str]:
    """`ds_io` arguments -> `dsaio-bench` arguments."""
    p = _Parser(prog="ds_io", add_help=False)
    p.add_argument("--folder", default=None)
    p.add_argument("--io_size", required=True)
    p.add_argument("--read", action="store_true")
    p.add_argument("--block_size", default="1M")
    p.add_argument("--queue_depth", type=int, default=32)  # DeepSpeed's default (dsaio-bench's is 8)
    p.add_argument("--single_submit", action="store_true")
    p.add_argument("--sequential_requests", action="store_true")
    p.add_argument("--engine", default="aio_handle")
    p.add_argument("--loops", type=int, default=3)
    p.add_argument("--io_parallel", type=int, default=None)
    p.add_argument("--warmup_loops", type=int, default=1)  # dsaio-bench warms up once, as this default asks
    p.add_argument("--fast_io_size", default=None)  # sizes torch_fastio's buffer, an engine refused below: no effect
    p.add_argument("--folder_to_device_mapping", nargs="+", default=[])
    p.add_argument("--multi_process", type=int, default=1)
    for flag in ("gpu", "use_gds", "slow_bounce_buffer", "torch_legacy_save", "use_accelerator_pin_memory",
                 "validate", "include_warmup_time", "different_file_each_iteration"):
        p.add_argument(f"--{flag}", action="store_true")
    args = p.parse_args(argv)
    _refuse(p, args, _DS_IO_UNSUPPORTED, "ds_io")
    if args.engine not in _DS_IO_ENGINES:
        raise NvmeArgumentError(f"--engine {args.engine} is not supported by dstrain's ds_io: dsaio measures its own "
                                f"aio handle ({' or '.join(_DS_IO_ENGINES)})")
    if args.folder is None:
        raise NvmeArgumentError("--folder is required: the directory to read and write in")
    if args.warmup_loops != 1:
        raise NvmeArgumentError(f"--warmup_loops {args.warmup_loops} is not supported by dstrain's ds_io: dsaio-bench "
                                f"warms up once")
    out = ["--path", args.folder, "--size", args.io_size, "--op", "read" if args.read else "write",
           "--block_size", args.block_size, "--queue_depth", str(args.queue_depth), "--loops", str(args.loops)]
    if args.io_parallel is not None:
        out += ["--intra_op_parallelism", str(args.io_parallel)]
    if args.single_submit:
        out.append("--single_submit")
    if args.sequential_requests:
        out.append("--no_overlap_events")
    return out


_TUNE_UNSUPPORTED = {
    "sweep_config": "dsaio-tune sweeps its own grid (block size, queue depth, parallelism, submit and overlap modes)",
    "no_read": "dsaio-tune measures reads and writes together",
    "no_write": "dsaio-tune measures reads and writes together",
    "gpu": "dsaio moves host memory",
    "gds": "dsaio has no GPUDirect Storage engine",
    "log_dir": "dsaio-tune prints its table and the best \"aio\" settings instead of writing logs",
}


def ds_nvme_tune_to_dsaio_tune(argv: list[str]) -> list[str]:
    """`ds_nvme_tune` arguments -> `dsaio-tune` arguments."""
    p = _Parser(prog="ds_nvme_tune", add_help=False)
    p.add_argument("--nvme_dir", nargs="+", required=True)
    p.add_argument("--io_size", default="400M")  # DeepSpeed's default
    p.add_argument("--loops", type=int, default=1)  # DeepSpeed's default
    p.add_argument("--sweep_config", default=None)
    p.add_argument("--log_dir", default=None)
    for flag in ("no_read", "no_write", "gpu", "gds", "flush_page_cache", "verbose"):
        p.add_argument(f"--{flag}", action="store_true")
    args = p.parse_args(argv)
    _refuse(p, args, _TUNE_UNSUPPORTED, "ds_nvme_tune")
    if len(args.nvme_dir) != 1:
        raise NvmeArgumentError(f"--nvme_dir with {len(args.nvme_dir)} folders is not supported by dstrain's "
                                f"ds_nvme_tune: tune one device at a time")
    # --flush_page_cache: dsaio drops the page cache before each read where it may, and reads with O_DIRECT.
    return ["--path", args.nvme_dir[0], "--io_size", args.io_size, "--loops", str(args.loops)]
