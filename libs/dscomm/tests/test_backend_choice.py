"""init_distributed(dist_backend=...): a backend this torch build lacks, or a name torch does not know, is
an error saying so and naming the backends that work here, before any rendezvous is tried."""

import os
import subprocess
import sys

import pytest
import torch.distributed as dist

import dscomm
from dscomm import CommError

CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}


def _refusal(backend: str, monkeypatch) -> str:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CommError) as info:
        dscomm.init_distributed(dist_backend=backend)
    assert not dist.is_initialized()  # refused before any process group was made
    return str(info.value)


@pytest.mark.skipif(dist.is_nccl_available(), reason="this torch build has NCCL")
@pytest.mark.parametrize("backend", ["nccl", "NCCL", "cpu:gloo,cuda:nccl"])
def test_nccl_on_a_torch_without_it_says_so(backend, monkeypatch):
    message = _refusal(backend, monkeypatch)
    assert f"dist_backend={backend!r}: NCCL is not available in this torch build" in message
    assert "use dist_backend='gloo'" in message and "install a CUDA build of torch" in message
    assert "could not join" not in message
    assert "Available here: gloo" in message


@pytest.mark.skipif("ccl" in dist.Backend.backend_list, reason="a oneCCL backend is registered")
def test_ccl_without_its_package_names_the_package(monkeypatch):
    message = _refusal("ccl", monkeypatch)
    assert "'ccl' (Intel oneCCL) is registered by the oneccl_bindings_for_pytorch package" in message
    assert "backends available here: gloo" in message


@pytest.mark.parametrize("backend", ["nccll", "undefined", "cpu:glooo", " , "])
def test_unknown_names_list_the_valid_ones(backend, monkeypatch):
    message = _refusal(backend, monkeypatch)
    assert repr(backend) in message
    if backend.strip(" ,"):
        assert "unknown dist_backend" in message
        assert "valid names are gloo, nccl, mpi, ucc, xccl" in message
        assert "ccl (with oneccl_bindings_for_pytorch)" in message
    assert "available here: gloo" in message


@pytest.mark.parametrize("backend", ["gloo", "Gloo", "cpu:gloo", ""])  # '' is the default, as it always was
def test_valid_spellings_still_start(backend):
    out = subprocess.run([sys.executable, "-c", "import sys, dscomm\n"
                          "dscomm.init_distributed(dist_backend=sys.argv[1]); print(dscomm.get_backend())\n"
                          "dscomm.destroy()", backend], capture_output=True, text=True, timeout=120, env=CLEAN_ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] in ("gloo", "cpu:gloo")
