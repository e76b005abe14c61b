"""A pytest plugin (`-p forkserver_preload`) that only makes DeepSpeed's harness faster on a small machine.

DeepSpeed's harness starts every rank from a forkserver, and each rank then imports torch, deepspeed and the
test module itself (and torch's first optimizer, torch._dynamo): seconds per rank on a loaded 2-core machine, for every test. Preloading them in the
forkserver once makes each rank a fork of a process that has them. Nothing the tests see changes.
"""

import multiprocessing


def pytest_configure(config):
    multiprocessing.set_forkserver_preload(["torch", "torch._dynamo", "deepspeed", "deepspeed.comm", "unit.common", "unit.simple_model"])
