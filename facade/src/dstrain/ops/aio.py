"""`deepspeed.ops.aio`: DeepNVMe's handle (dsaio's) and its builder, as DeepSpeed's module offers them."""

from dsaio import aio_handle

from .op_builder import AsyncIOBuilder

__all__ = ["AsyncIOBuilder", "aio_handle"]
