"""`deepspeed.git_version_info`: what DeepSpeed records of its build (version, ops, the torch it was built
against), answered for this dstrain: its version, its ops (every op dstrain provides counts as installed: the
libraries ship their kernels or run in torch, nothing is compiled at first use), and the running torch."""

from __future__ import annotations

import torch

from .._version import __git_branch__, __git_hash__, __version__
from ..ops.op_builder import compatible_ops as _compatible_ops

version = __version__
git_hash = __git_hash__  # dstrain is not a DeepSpeed build: no DeepSpeed commit to name
git_branch = __git_branch__

compatible_ops = _compatible_ops()
installed_ops = dict(compatible_ops)
accelerator_name = "cuda" if torch.cuda.is_available() else "cpu"


def _nccl_version() -> str:
    if not torch.cuda.is_available():
        return "0.0"
    found = torch.cuda.nccl.version()
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


torch_info = {
    "version": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
    "cuda_version": ".".join((torch.version.cuda or "0.0").split(".")[:2]),
    "hip_version": ".".join((getattr(torch.version, "hip", None) or "0.0").split(".")[:2]),
    "nccl_version": _nccl_version(),
    "bf16_support": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
}

__all__ = ["accelerator_name", "compatible_ops", "git_branch", "git_hash", "installed_ops", "torch_info", "version"]
