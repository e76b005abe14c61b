"""Which parameters Muon updates, and which it orthogonalises head by head (DeepSpeed's rules).

Muon or Adam (DeepSpeed's rule, by shape and name; `optimizer.type: Muon` applies it to the model):

| parameter                                                | update                |
|----------------------------------------------------------|-----------------------|
| 2-D or more, name without "embed" or "lm_head"           | Muon (muon_lr)        |
| name with "embed" (token, position embeddings)           | Adam/AdamW (adam_lr)  |
| name with "lm_head" (the output head)                    | Adam/AdamW (adam_lr)  |
| 1-D (biases, norm gains)                                 | Adam/AdamW (adam_lr)  |

A `use_muon` attribute already on a parameter is kept: whoever set it chose.

Per head (`per_head_muon: true`): a projection of [heads * width, in] rows is orthogonalised as
[heads, width, in] (p.muon_num_heads = heads). By the last part of the module path:

| projection                                              | per head | width                          |
|---------------------------------------------------------|----------|--------------------------------|
| q_proj / query / wq                                     | yes      | head_dim (MLA: qk_nope + qk_rope) |
| k_proj / v_proj / key / value / wk / wv                 | yes      | head_dim, by the KV head count |
| MLA q_b_proj / kv_b_proj                                | yes      | qk_nope + qk_rope / qk_nope + v_head_dim |
| o_proj and other output projections                     | no       | heads are on the input dim     |
| fused qkv_proj / query_key_value / c_attn / wqkv        | no       | sections differ under GQA      |
| MLA q_a_proj / kv_a_proj_with_mqa                       | no       | latent down-projections        |
| sparse-attention indexers (a path with "indexer")       | no       | they pick keys, not attention  |
| q/k/v of a linear-attention module in LINEAR_ATTENTION_OWNERS | yes | the module's num_heads x head_dim |

The geometry comes from the model's config (head counts as dstp reads them, widths from the fields
the architecture defines); the name is a claim the shape must confirm: every geometry the config
makes plausible for the name is tried, and a projection is tagged only when its rows equal heads x
width for one of them. Geometries that confirm with different head counts conflict: the projection
is skipped with a warning. A tensor-parallel shard (dscomm.TENSOR_PARALLEL_ATTR) holds whole heads
when its rows are a multiple of the width: its head count is re-resolved as rows / width.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

import dscomm

from ..wiring.optional_libs import require

QUERY = ("q_proj", "query", "wq")
KEY_VALUE = ("k_proj", "v_proj", "key", "value", "wk", "wv")
MLA_QUERY_UP, MLA_KV_UP = "q_b_proj", "kv_b_proj"
EXCLUDED_KEYWORDS = ("embed", "lm_head")  # DeepSpeed's: embeddings and the output head take Adam

# Linear-attention modules whose head geometry is their own (config fields do not describe it), with
# the model each was checked on; their q/k/v projections are split by the module's attributes.
LINEAR_ATTENTION_OWNERS = {"KimiDeltaAttention": "Kimi-K3"}
LINEAR_ATTENTION_ATTRS = ("num_heads", "head_dim")


def select_muon_parameters(model: torch.nn.Module) -> None:
    """Set `use_muon` on every parameter of `model` by the rule above (kept where already set)."""
    for name, param in model.named_parameters():
        if getattr(param, "use_muon", None) is None:
            param.use_muon = len(_full_shape(param)) >= 2 and not any(w in name.lower() for w in EXCLUDED_KEYWORDS)


@dataclass
class HeadTags:
    """What per-head tagging did: tagged projections (name -> heads), and the attention-named ones left
    on the full-matrix path: unconfirmed (no geometry matched the shape) and conflicting."""

    tagged: dict[str, int] = field(default_factory=dict)
    unconfirmed: list[str] = field(default_factory=list)
    conflicts: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadGeometry:
    """The head counts and per-head widths a config makes plausible, by kind of projection."""

    heads: int | None = None
    kv_heads: int | None = None
    head_dims: tuple[int, ...] = ()  # the head_dim field and hidden / heads
    mla_query_width: int | None = None  # qk_nope_head_dim + qk_rope_head_dim
    mla_kv_width: int | None = None  # qk_nope_head_dim + v_head_dim

    @classmethod
    def from_config(cls, config: Any) -> HeadGeometry:
        if config is None:
            return cls()
        # dstp is optional: only per-head Muon reads a model's geometry (dstp's reading of HF configs)
        dstp = require("dstp", "optimizer.params.per_head_muon (the model's attention geometry)")
        shape = dstp.ModelGeometry.from_config(config)
        text = getattr(config, "text_config", None)
        fields = text if text is not None and getattr(config, "num_attention_heads", None) is None else config
        widths = [getattr(fields, "head_dim", None)]
        if shape.hidden_size and shape.num_attention_heads:
            widths.append(shape.hidden_size // shape.num_attention_heads)
        nope, rope, value = (getattr(fields, key, None) for key in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                                    "v_head_dim"))
        return cls(heads=shape.num_attention_heads, kv_heads=shape.num_key_value_heads,
                   head_dims=tuple(dict.fromkeys(w for w in widths if isinstance(w, int) and w > 0)),
                   mla_query_width=nope + rope if nope and rope else None,
                   mla_kv_width=nope + value if nope and value else None)

    def candidates(self, projection: str) -> list[tuple[int, int]]:
        """(heads, width) pairs plausible for a projection of this name."""
        heads = [self.heads] if self.heads else []
        if projection in QUERY:
            widths = list(self.head_dims) + ([self.mla_query_width] if self.mla_query_width else [])
            return [(h, w) for h in heads for w in widths]
        if projection in KEY_VALUE:
            counts = list(dict.fromkeys(c for c in (self.kv_heads, self.heads) if c))
            return [(h, w) for h in counts for w in self.head_dims]
        if projection == MLA_QUERY_UP and self.mla_query_width:
            return [(h, self.mla_query_width) for h in heads]
        if projection == MLA_KV_UP and self.mla_kv_width:
            return [(h, self.mla_kv_width) for h in heads]
        return []


def tag_attention_heads(model: torch.nn.Module) -> HeadTags:
    """Set `muon_num_heads` on the projections the table above splits per head; warn about the rest."""
    geometry = HeadGeometry.from_config(getattr(model, "config", None))
    modules = dict(model.named_modules())
    tags = HeadTags()
    for name, param in model.named_parameters():
        module_path, _, leaf = name.rpartition(".")
        owner_path, _, projection = module_path.rpartition(".")
        shape = _full_shape(param)
        if (leaf != "weight" or len(shape) != 2 or not getattr(param, "use_muon", False)
                or projection not in (*QUERY, *KEY_VALUE, MLA_QUERY_UP, MLA_KV_UP) or "indexer" in name.lower()):
            continue
        owner = modules.get(owner_path)
        if owner is not None and type(owner).__name__ in LINEAR_ATTENTION_OWNERS:
            if projection not in (*QUERY, *KEY_VALUE):
                continue
            candidates = _linear_attention_geometry(owner)
        else:
            candidates = geometry.candidates(projection)
        confirmed = _confirm(shape[0], candidates, dscomm.is_tensor_parallel(param))
        counts = sorted({heads for heads, _ in confirmed})
        if len(counts) == 1:
            param.muon_num_heads = counts[0]
            tags.tagged[name] = counts[0]
        elif counts:
            tags.conflicts[name] = confirmed
        else:
            tags.unconfirmed.append(name)
    if tags.unconfirmed or tags.conflicts:
        warnings.warn(_describe_skipped(tags), stacklevel=3)
    return tags


def _full_shape(param: torch.Tensor) -> tuple[int, ...]:
    # Built inside dszero.Init a parameter is an empty shard; ds_shape is its whole shape.
    return tuple(getattr(param, "ds_shape", None) or param.shape)


def _linear_attention_geometry(module: torch.nn.Module) -> list[tuple[int, int]]:
    heads, width = (getattr(module, attr, None) for attr in LINEAR_ATTENTION_ATTRS)
    return [(heads, width)] if isinstance(heads, int) and isinstance(width, int) else []


def _confirm(rows: int, candidates: list[tuple[int, int]], tensor_parallel: bool) -> list[tuple[int, int]]:
    """(heads on this tensor, width) for each candidate the rows confirm."""
    confirmed = []
    for heads, width in candidates:
        if tensor_parallel:
            # A column-parallel shard holds rows / width whole heads when the width divides its rows.
            if rows % width == 0 and heads % (rows // width) == 0:
                confirmed.append((rows // width, width))
        elif rows == heads * width:
            confirmed.append((heads, width))
    return confirmed


def _describe_skipped(tags: HeadTags) -> str:
    parts = []
    if tags.unconfirmed:
        parts.append(f"{len(tags.unconfirmed)} attention projection(s) whose shape confirms no head geometry of the "
                     f"model's config (first: {tags.unconfirmed[0]})")
    if tags.conflicts:
        name, found = next(iter(tags.conflicts.items()))
        parts.append(f"{len(tags.conflicts)} whose shape fits geometries with different head counts (first: {name}, "
                     f"(heads, width) = {found})")
    return ("per_head_muon: " + "; ".join(parts) + " stay on the full-matrix path (orthogonalised whole)")
