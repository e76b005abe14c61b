"""The transformer kernel and sparse attention do not go together (DeepSpeed's tutorial says the same)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsconfig.errors import Problem

from ...errors import UnsupportedFeatureError

SPARSE_ATTENTION_NOTE = ("the DeepSpeed transformer kernel does not support sparse attention; to use sparse "
                         "attention, turn the transformer kernel off (drop --deepspeed_transformer_kernel), or "
                         "remove the config's sparse_attention section to keep the kernel")


def refuse_sparse_attention(ds_config: Mapping[str, Any] | None, source: str | None = None) -> None:
    """Refuses a DeepSpeed config (as a dict) that asks for sparse attention beside the transformer kernel."""
    if ds_config and ds_config.get("sparse_attention"):
        raise UnsupportedFeatureError(Problem("sparse_attention", SPARSE_ATTENTION_NOTE), source=source)
