"""Generation tensor-parallel over `inference_tp_size` ranks (hybrid_engine.inference_tp_size > 1).

The training model keeps its layout. Beside it, each rank holds a replica of the model built from its
Hugging Face config and cut by dstp's AutoTP rules over the rank's inference group (consecutive ranks of
the data-parallel group). Before each generation the replica's shards are refilled from the training
weights (at ZeRO-3, gathered `tp_gather_partition_size` decoder layers at a time, so at most that many
layers are whole at once); the prompts of the group are gathered into one batch, generated together,
and each rank gets its own rows back.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

import dscomm
import dszero
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ...wiring.optional_libs import require

KEY = "hybrid_engine.inference_tp_size"
_LAYER = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")


def inference_groups(data_group: Any, size: int) -> Any:
    """This rank's group of `size` consecutive data-parallel ranks (collective: every rank creates every group)."""
    ranks = dist.get_process_group_ranks(data_group) if data_group is not None else list(range(dist.get_world_size()))
    if len(ranks) % size:
        raise ConfigError(Problem(KEY, f"must divide the data-parallel size {len(ranks)} (generation groups are "
                                       f"consecutive data-parallel ranks)", size))
    mine = None
    for start in range(0, len(ranks), size):
        members = ranks[start:start + size]
        group = dist.new_group(members)
        if dist.get_rank() in members:
            mine = group
    return mine


class InferenceReplica:
    """The tensor-parallel copy of `module` that generation runs on."""

    def __init__(self, module: torch.nn.Module, cfg: DeepSpeedConfig, group: Any, device: torch.device):
        dstp = require("dstp", f"{KEY} > 1 (tensor-parallel generation)")
        config = getattr(module, "config", None)
        if config is None or not hasattr(type(module), "generate"):
            raise ConfigError(Problem(KEY, f"tensor-parallel generation rebuilds the model from its Hugging Face "
                                           f"config; {type(module).__name__} has none: use inference_tp_size 1",
                                      cfg.hybrid_engine.inference_tp_size))
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.partition = cfg.hybrid_engine.tp_gather_partition_size
        self.release_between = cfg.hybrid_engine.release_inference_cache
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
        with torch.device(device):
            replica = type(module)(config).to(dtype)
        replica.eval()
        replica.requires_grad_(False)
        tp = cfg.tensor_parallel
        try:
            self.plan = dstp.plan_for(replica, self.size, preset_model=tp.preset_model,
                                      partition_config=tp.partition_config)
            dstp.parallelize(replica, group, self.plan)
        except dstp.TensorParallelError as exc:
            raise ConfigError(Problem(KEY, f"cannot cut {type(module).__name__} over {self.size} ranks: {exc}",
                                      self.size)) from None
        self.replica = replica
        self.dstp = dstp
        own = dict(module.named_parameters())
        theirs = dict(replica.named_parameters())
        missing = sorted(set(theirs) - set(own))
        if missing:
            raise ConfigError(Problem(KEY, f"the model rebuilt from its config has parameters the trained model lacks "
                                           f"({missing[:3]}): tensor-parallel generation needs the two to match",
                                      self.size))
        self.pairs = [(name, own[name], theirs[name]) for name in theirs]
        self._shapes = {name: tuple(p.shape) for name, _, p in self.pairs}
        self.buffers = [(dict(module.named_buffers())[n], b) for n, b in replica.named_buffers()
                        if n in dict(module.named_buffers())]
        self.allocated = True
        self.peak_whole_numel = 0  # the most training-weight elements gathered whole at once (one chunk)

    # ------------------------------------------------------------------ weights
    def chunks(self) -> Iterator[list[tuple[str, torch.nn.Parameter, torch.nn.Parameter]]]:
        """The parameter pairs, `tp_gather_partition_size` decoder layers at a time, then the rest."""
        layers: dict[int, list] = {}
        rest = []
        for pair in self.pairs:
            found = _LAYER.search("." + pair[0])
            (layers.setdefault(int(found.group(1)), []) if found else rest).append(pair)
        ordered = [layers[i] for i in sorted(layers)]
        for start in range(0, len(ordered), self.partition):
            yield [pair for layer in ordered[start:start + self.partition] for pair in layer]
        if rest:
            yield rest

    def refresh(self, lora: dict[str, torch.nn.Module], fused: Any) -> float:
        """Copy this rank's shard of every (gathered, LoRA-fused) training weight into the replica; seconds taken.
        `lora`: {module name: module} of the training model's LoRA modules; `fused(modules)`: their fusion."""
        started = time.perf_counter()
        self._allocate()
        with torch.no_grad():
            for chunk in self.chunks():
                names = {name.rpartition(".")[0] for name, _, _ in chunk}
                chunk_lora = [module for prefix, module in lora.items() if prefix in names]
                whole = [own for _, own, _ in chunk] + [p for m in chunk_lora for p in m.parameters(recurse=False)]
                with dszero.GatheredParameters(whole), fused(chunk_lora):
                    self.peak_whole_numel = max(self.peak_whole_numel, sum(p.numel() for p in whole))
                    for name, own, mine in chunk:
                        planned = self.plan.params.get(name)
                        value = own.detach()
                        if planned is not None and planned.sharded:
                            value = self.dstp.shard_tensor(value, planned, self.rank, self.size)
                        mine.copy_(value)
            for own, mine in self.buffers:
                mine.copy_(own)
        return time.perf_counter() - started

    def _allocate(self) -> None:
        if not self.allocated:
            for name, _, mine in self.pairs:
                mine.data = torch.empty(self._shapes[name], dtype=mine.dtype, device=mine.device)
            self.allocated = True

    def release(self) -> None:
        """release_inference_cache: the replica's weights are freed until the next generation."""
        for _, _, mine in self.pairs:
            mine.data = torch.empty(0, dtype=mine.dtype, device=mine.device)
        self.allocated = False

    # ------------------------------------------------------------------ the batch
    def generate(self, generate: Any, prompts: torch.Tensor, kwargs: dict[str, Any], new_tokens: int,
                 pad_id: int) -> torch.Tensor:
        """Generate the group's prompts together with `generate` (the replica's); this rank's rows back."""
        if kwargs.get("return_dict_in_generate"):
            raise ConfigError(Problem(KEY, "tensor-parallel generation returns token ids only: leave "
                                           "return_dict_in_generate unset", self.size))
        mask = kwargs.pop("attention_mask", None)
        if mask is None:
            mask = torch.ones_like(prompts)
        own_rows, own_len = prompts.shape
        facts = torch.tensor([own_rows, own_len, new_tokens], dtype=torch.long)
        every = [torch.zeros_like(facts) for _ in range(self.size)]
        dscomm.all_gather(every, facts, group=self.group, log_name="hybrid_prompt_shapes")
        rows = [int(f[0]) for f in every]
        longest = max(int(f[1]) for f in every)
        steps = max(int(f[2]) for f in every)
        padded = _left_pad(prompts, longest, pad_id)
        padded_mask = _left_pad(mask.to(prompts.dtype), longest, 0)
        batch = _gather_rows(padded, rows, self.group)
        batch_mask = _gather_rows(padded_mask, rows, self.group)
        kwargs = {k: v for k, v in kwargs.items()
                  if k not in ("max_length", "max_new_tokens", "synced_gpus", "pad_token_id")}
        output = generate(batch, attention_mask=batch_mask, max_new_tokens=steps, pad_token_id=pad_id, **kwargs)
        start = sum(rows[:self.rank])
        mine = output[start:start + own_rows, longest - own_len:]
        return mine[:, :own_len + new_tokens]


def _left_pad(tensor: torch.Tensor, length: int, value: int) -> torch.Tensor:
    missing = length - tensor.shape[1]
    if missing == 0:
        return tensor
    pad = torch.full((tensor.shape[0], missing), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([pad, tensor], dim=1)


def _gather_rows(tensor: torch.Tensor, rows: list[int], group: Any) -> torch.Tensor:
    """Every rank's rows (counts may differ), in group-rank order."""
    width = tensor.shape[1]
    most = max(rows)
    padded = torch.zeros((most, width), dtype=tensor.dtype, device=tensor.device)
    padded[:tensor.shape[0]] = tensor
    pieces = [torch.zeros_like(padded) for _ in rows]
    dscomm.all_gather(pieces, padded, group=group, log_name="hybrid_prompts")
    return torch.cat([piece[:count] for piece, count in zip(pieces, rows)])
