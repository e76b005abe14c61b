"""The whole module's weights as one state dict, gathered from ZeRO-3's shards module by module (so a rank
holds one module's whole parameters at a time, plus what it has collected): DeepSpeed's
`engine._zero3_consolidated_16bit_state_dict`, which Hugging Face's Trainer and Accelerate call to save a
model trained at stage 3."""

from __future__ import annotations

import torch
import torch.distributed as dist

import dszero


def consolidated_state_dict(module: torch.nn.Module, exclude_frozen_parameters: bool = False
                            ) -> dict[str, torch.Tensor] | None:
    """The state dict (parameters in their training dtype, persistent buffers) on the CPU of global rank 0,
    None on the other ranks, which must all call it (it gathers). A parameter shared by several modules
    (tied embeddings) is one tensor under each of its names, as in the module's own state_dict."""
    collect = dist.get_rank() == 0
    state: dict[str, torch.Tensor] | None = {} if collect else None
    first_name: dict[int, str] = {}

    def visit(sub: torch.nn.Module, prefix: str) -> None:
        own = [p for p in sub.parameters(recurse=False) if p is not None]
        with dszero.GatheredParameters(own):  # stages 0-2: nothing is partitioned, they pass through
            if state is not None:
                for name, param in sub.named_parameters(recurse=False, remove_duplicate=False):
                    if param is None or (exclude_frozen_parameters and not param.requires_grad):
                        continue
                    key = prefix + name
                    if id(param) in first_name:
                        state[key] = state[first_name[id(param)]]
                    else:
                        state[key] = param.detach().to("cpu", copy=True)
                        first_name[id(param)] = key
                for name, buffer in sub.named_buffers(recurse=False):
                    if buffer is not None and name not in sub._non_persistent_buffers_set:
                        state[prefix + name] = buffer.detach().to("cpu", copy=True)
        for name, child in sub.named_children():
            visit(child, f"{prefix}{name}.")

    visit(module, "")
    return state
