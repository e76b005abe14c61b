"""The Triton kernels equal the torch path (triton_checks/check_triton_kernels.py), on a GPU where there is
one and under Triton's CPU interpreter elsewhere. The checks run in a process of their own because
TRITON_INTERPRET must be set before triton is first imported. Skipped where triton is not installed
(it is the optional extra dstrain[kernels])."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHECKS = Path(__file__).parent / "triton_checks" / "check_triton_kernels.py"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install 'dstrain[kernels]')")


def test_triton_kernels_equal_the_torch_path():
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    env.pop("DSTRAIN_KERNELS", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                          str(CHECKS)], capture_output=True, text=True, timeout=600, env=env, cwd=CHECKS.parent)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
