"""`deepspeed.ops.op_builder`: DeepSpeed's op builders, answered by what dstrain provides instead of compiled
extensions.

DeepSpeed compiles each op (`CPUAdamBuilder().load()`) and scripts ask first whether it can
(`is_compatible()`, or `deepspeed.ops.__compatible_ops__[Builder.NAME]`). Here an op dstrain implements is
compatible and `load()` returns the module that provides it (nothing is compiled: the libraries ship their
kernels, or run in torch): `AsyncIOBuilder().load().aio_handle(...)` is dsaio's handle,
`GDSBuilder().load().gds_handle(...)` its GPUDirect handle (compatible only where cuFile is found),
`CPUAdamBuilder().load()` dszero's CPU optimizers. An op dstrain does not implement (inference kernels,
quantizers, Evoformer, ...) is not compatible, and its `load()` raises an ImportError naming it, as a DeepSpeed
whose op cannot be built does.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class OpBuilder:
    """One op: NAME, whether it works here (is_compatible), and load() for what provides it."""

    NAME = "op"
    # The module that provides the op (None: dstrain has no such op), and why it is missing where it is.
    PROVIDER: str | None = None
    MISSING = "dstrain does not implement this op"

    def __init__(self, name: str | None = None):
        self.name = name or self.NAME

    def absolute_name(self) -> str:
        return f"deepspeed.ops.{self.name}_op"

    def why_incompatible(self) -> str | None:
        """None where the op works here, else the reason."""
        return None if self.PROVIDER is not None else self.MISSING

    def is_compatible(self, verbose: bool = False) -> bool:
        return self.why_incompatible() is None

    def load(self, verbose: bool = True) -> ModuleType:
        reason = self.why_incompatible()
        if reason is not None:
            raise ImportError(f"{type(self).__name__} ({self.NAME}) cannot be loaded: {reason}", name=self.NAME)
        return importlib.import_module(self.PROVIDER)

    def builder(self):
        raise ImportError(f"{type(self).__name__}: dstrain compiles no extensions; load() returns the op")

    # Queries DeepSpeed's tests and scripts make of the build environment.
    @staticmethod
    def installed_cuda_version(name: str = "") -> tuple[int, int]:
        import torch

        if not torch.version.cuda:
            raise ImportError("no CUDA toolkit: this torch is built without CUDA")
        major, minor = torch.version.cuda.split(".")[:2]
        return int(major), int(minor)

    @staticmethod
    def installed_rocm_version() -> tuple[int, int]:
        import torch

        hip = getattr(torch.version, "hip", None)
        if not hip:
            return 0, 0
        major, minor = hip.split(".")[:2]
        return int(major), int(minor)

    @staticmethod
    def is_rocm_pytorch() -> bool:
        import torch

        return bool(getattr(torch.version, "hip", None))


class AsyncIOBuilder(OpBuilder):
    NAME = "async_io"
    PROVIDER = "dsaio"


class GDSBuilder(OpBuilder):
    NAME = "gds"
    PROVIDER = "dsaio"

    def why_incompatible(self) -> str | None:
        from dsaio.gds import gds_missing

        missing = gds_missing()
        return "GPUDirect Storage is not available here: " + "; ".join(missing) if missing else None


class PinMemoryBuilder(OpBuilder):
    NAME = "pin_memory"
    PROVIDER = "dstrain.ops.pin_memory"


class CPUAdamBuilder(OpBuilder):
    NAME = "cpu_adam"
    PROVIDER = "dszero.ops"


class CPUAdagradBuilder(OpBuilder):
    NAME = "cpu_adagrad"
    PROVIDER = "dszero.ops"


class CPULionBuilder(OpBuilder):
    NAME = "cpu_lion"
    PROVIDER = "dszero.ops"


class FusedAdamBuilder(OpBuilder):
    NAME = "fused_adam"
    PROVIDER = "dszero.ops"


class FusedLambBuilder(OpBuilder):
    NAME = "fused_lamb"
    PROVIDER = "dstrain.ops"


class FusedLionBuilder(OpBuilder):
    NAME = "fused_lion"
    PROVIDER = "dszero.ops"


class TransformerBuilder(OpBuilder):
    NAME = "transformer"
    PROVIDER = "dstrain.ops.transformer"


def _missing(class_name: str, name: str, what: str) -> type[OpBuilder]:
    return type(class_name, (OpBuilder,), {"NAME": name, "MISSING": f"dstrain does not implement {what}",
                                           "__doc__": f"{what}: not provided by dstrain (is_compatible() is False)."})


# DeepSpeed's ops dstrain does not implement: inference, quantization and model-specific kernels.
InferenceBuilder = _missing("InferenceBuilder", "transformer_inference", "DeepSpeed's inference kernels")
SpatialInferenceBuilder = _missing("SpatialInferenceBuilder", "spatial_inference", "the spatial inference kernels")
RaggedOpsBuilder = _missing("RaggedOpsBuilder", "ragged_device_ops", "DeepSpeed-FastGen's ragged kernels")
RaggedUtilsBuilder = _missing("RaggedUtilsBuilder", "ragged_ops", "DeepSpeed-FastGen's ragged utilities")
InferenceCoreBuilder = _missing("InferenceCoreBuilder", "inference_core_ops", "the inference v2 core ops")
CUTLASSOpsBuilder = _missing("CUTLASSOpsBuilder", "cutlass_ops", "the CUTLASS MoE GEMMs")
AtomBuilder = _missing("AtomBuilder", "atom", "DeepSpeed-FastGen's atom builder")
QuantizerBuilder = _missing("QuantizerBuilder", "quantizer", "DeepSpeed's quantizer kernels")
FPQuantizerBuilder = _missing("FPQuantizerBuilder", "fp_quantizer", "the FP8/FP6 quantizer")
EvoformerAttnBuilder = _missing("EvoformerAttnBuilder", "evoformer_attn", "DeepSpeed4Science's Evoformer attention")
SparseAttnBuilder = _missing("SparseAttnBuilder", "sparse_attn", "the block-sparse attention kernels")
StochasticTransformerBuilder = _missing("StochasticTransformerBuilder", "stochastic_transformer",
                                        "the stochastic-mode transformer kernel")
RandomLTDBuilder = _missing("RandomLTDBuilder", "random_ltd", "random-LTD's token gather kernels (dsdata does it in torch)")
UtilsBuilder = _missing("UtilsBuilder", "utils", "DeepSpeed's flatten/unflatten extension (torch's is used)")
CCLCommBuilder = _missing("CCLCommBuilder", "deepspeed_ccl_comm", "oneCCL communication")
ShareMemCommBuilder = _missing("ShareMemCommBuilder", "deepspeed_shm_comm", "the shared-memory communication op")
DeepCompileBuilder = _missing("DeepCompileBuilder", "dc", "DeepCompile's native op")
NotImplementedBuilder = _missing("NotImplementedBuilder", "deepspeed_not_implemented", "this op")

ALL_OPS: dict[str, OpBuilder] = {
    builder.NAME: builder() for builder in (
        AsyncIOBuilder, GDSBuilder, PinMemoryBuilder, CPUAdamBuilder, CPUAdagradBuilder, CPULionBuilder,
        FusedAdamBuilder, FusedLambBuilder, TransformerBuilder, InferenceBuilder, SpatialInferenceBuilder,
        RaggedOpsBuilder, RaggedUtilsBuilder, InferenceCoreBuilder, CUTLASSOpsBuilder, AtomBuilder,
        QuantizerBuilder, FPQuantizerBuilder, EvoformerAttnBuilder, SparseAttnBuilder, StochasticTransformerBuilder,
        RandomLTDBuilder, UtilsBuilder, CCLCommBuilder, ShareMemCommBuilder, DeepCompileBuilder, FusedLionBuilder)
}


def compatible_ops() -> dict[str, bool]:
    """DeepSpeed's `deepspeed.ops.__compatible_ops__`: each op's name -> whether it works here."""
    return {name: builder.is_compatible() for name, builder in ALL_OPS.items()}
