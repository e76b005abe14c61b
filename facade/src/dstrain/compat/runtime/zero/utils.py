"""`deepspeed.runtime.zero.utils`: the exception scripts catch around ZeRO. `ZeRORuntimeException` is dszero's
`ZeroError`, so an `except ZeRORuntimeException` catches what dstrain's ZeRO raises (its config errors too)."""

from dszero.errors import ZeroError as ZeRORuntimeException

__all__ = ["ZeRORuntimeException"]
