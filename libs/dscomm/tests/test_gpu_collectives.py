"""On a CUDA GPU: dscomm's collectives take host tensors on NCCL (a world of one), as they do on gloo.

Code above dscomm hands small CPU tensors to collectives (a checkpoint tag's digest, a save id, gradient
norm statistics, comms summaries); NCCL alone would refuse them. Each run is a process of its own (CUDA
must not be forked). Skipped without CUDA; DSTRAIN_GPU_REHEARSAL=1 runs the gloo side only.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]

SCRIPT = Path(__file__).parent / "scripts" / "host_tensors_on_nccl.py"
_RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
EXPECTED = {"all_reduce": [3.0, 4.0], "broadcast": [7], "all_gather": [1.0, 2.0],
            "all_gather_into_tensor": [5.0, 6.0], "reduce_scatter_tensor": [8.0, 9.0],
            "async_all_reduce": [2.5], "summary_ranks": 1, "devices": ["cpu"]}


def run(backend: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}
    done = subprocess.run([sys.executable, str(SCRIPT), backend], capture_output=True, text=True, timeout=240,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_host_tensors_come_back_with_the_collectives_results(backend):
    if backend == "nccl" and not CUDA:
        pytest.skip("the rehearsal has no NCCL: the gloo run holds the same expectations")
    assert run(backend) == EXPECTED
