"""Ulysses inside Hugging Face transformers: DeepSpeed's `UlyssesSPAttentionHF`.

`register_with_transformers` puts a wrapper in place of the chosen attention implementation
(`ALL_ATTENTION_FUNCTIONS["sdpa"]`, ...), so every model that uses it, built before or after, runs
Ulysses around it: the wrapper receives this rank's slice of the sequence in Hugging Face's
[batch, heads, seq/sp, dim] layout, exchanges it for the whole sequence of its share of the heads,
calls the original function, and exchanges the result back. Replacing the implementation's entry,
rather than registering a new name, keeps every other branch transformers takes for that
implementation. `restore_transformers_attention()` puts the originals back.

The core attention runs causal over the whole sequence with no mask: Hugging Face builds none when
every token is visible, and a mask it did build (padding) is of this rank's slice only, so it is
refused, never dropped. position_ids, all-gathered, carry the document boundaries of packed samples to
implementations that read them (flash attention); with sdpa, which does not, packed samples are
refused rather than attended across documents. eager and flex_attention build a mask object for the
slice and are refused at registration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

import dscomm

from .comm import all_to_all, gather_sequence, group_rank, group_size
from .errors import SequenceParallelError
from .heads import split_heads

logger = logging.getLogger("dsseq")

# Implementations that take the causal pattern from position_ids / is_causal, not from a 4-D mask.
_POSITION_BLIND = ("sdpa",)
# Implementations Ulysses cannot wrap: a 4-D mask of the whole sequence, or a mask object built per slice.
_NEEDS_4D_MASK = ("eager", "paged|eager", "flex_attention", "paged|flex_attention")
_ORIGINALS: dict[str, Callable[..., Any]] = {}  # implementation name -> transformers' own function


class _ModuleView:
    """The attention module as the core function sees it, with the GQA factor of this rank's heads
    (when key/value heads were repeated over the ranks) and nothing else changed."""

    def __init__(self, module: Any, num_key_value_groups: int):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "num_key_value_groups", num_key_value_groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class UlyssesSPAttentionHF(torch.nn.Module):
    """Ulysses around a Hugging Face attention function `attn`, over `process_group`.

    `seq_length_is_variable`: the sequence length may change from batch to batch (shapes are read at
    each call); otherwise `local_seq_length` / `global_seq_length` are fixed and every call is checked
    against them. `disable_in_eval`: in eval mode call `attn` directly (unsharded evaluation).
    """

    def __init__(self, attn: Callable[..., Any], batch_size: int, attn_head_count: int, attn_head_size: int,
                 kv_head_count: int, num_hidden_layers: int, process_group: Any, seq_length_is_variable: bool = False,
                 local_seq_length: int | None = None, global_seq_length: int | None = None,
                 disable_in_eval: bool = False) -> None:
        super().__init__()
        self.attn = attn
        self.process_group = process_group
        self.world_size = group_size(process_group)
        self.sp_rank = group_rank(process_group)
        self.heads = split_heads(attn_head_count, kv_head_count, self.world_size, "UlyssesSPAttentionHF")
        self.batch_size = batch_size
        self.attn_head_size = attn_head_size
        self.attn_head_count = attn_head_count
        self.global_kv_head_count = kv_head_count
        self.local_q_head_count = self.heads.local_q
        self.local_kv_head_count = self.heads.local_kv
        self.kv_replication_factor = self.heads.kv_repeat
        self.num_hidden_layers = num_hidden_layers
        self.seq_length_is_variable = seq_length_is_variable
        self.disable_in_eval = disable_in_eval
        self.core_attn_implementation: str | None = None  # set by register_with_transformers
        if not seq_length_is_variable:
            if not isinstance(global_seq_length, int) or global_seq_length % self.world_size:
                raise SequenceParallelError(f"UlyssesSPAttentionHF: a fixed sequence length must be a multiple of "
                                            f"the sequence-parallel size {self.world_size}, got {global_seq_length!r}")
            if local_seq_length is None:
                local_seq_length = global_seq_length // self.world_size
            if local_seq_length * self.world_size != global_seq_length:
                raise SequenceParallelError(f"UlyssesSPAttentionHF: local_seq_length {local_seq_length} x "
                                            f"{self.world_size} ranks != global_seq_length {global_seq_length}")
        self.local_seq_length = local_seq_length
        self.global_seq_length = global_seq_length

    def forward(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """Hugging Face's attention-function call: q, k, v [batch, heads, seq/sp, dim]; returns
        ([batch, seq/sp, heads, dim], attention weights or None)."""
        if self.disable_in_eval and not module.training:
            return self.attn(module, query, key, value, attention_mask, *args, **kwargs)
        self._check_shapes(query, key, value)
        if self.heads.kv_repeat > 1:
            key = key.repeat_interleave(self.heads.kv_repeat, dim=1)
            value = value.repeat_interleave(self.heads.kv_repeat, dim=1)
        # [b, h, s/p, d] -> [b, h/p, s, d]: split the heads, join the sequence.
        q, k, v = (all_to_all(t, 1, 2, self.process_group) for t in (query, key, value))
        if "position_ids" not in kwargs or kwargs["position_ids"] is None:
            raise SequenceParallelError(
                "Ulysses needs position_ids in every forward call (model(..., position_ids=...)): without them each "
                "rank numbers its slice from 0 and the gathered positions look like packed documents; "
                "UlyssesSPDataLoaderAdapter / shard_batch keep them in the batch")
        positions = gather_sequence(kwargs["position_ids"], -1, self.process_group)
        kwargs["position_ids"] = positions
        if self.core_attn_implementation in _POSITION_BLIND:
            _refuse_packed(positions, self.core_attn_implementation)
        attention_mask = _whole_sequence_mask(attention_mask, self.core_attn_implementation)
        view = module
        if self.heads.kv_repeat > 1:
            view = _ModuleView(module, self.heads.local_groups)
        output, weights = self.attn(view, q, k, v, attention_mask, *args, **kwargs)
        # [b, s, h/p, d] -> [b, s/p, h, d]: split the sequence, join the heads.
        return all_to_all(output, 1, 2, self.process_group), weights

    def _check_shapes(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        b, s = (query.shape[0], query.shape[2]) if query.dim() == 4 else (None, None)
        expected_q = (b, self.attn_head_count, s, self.attn_head_size)
        expected_kv = (b, self.global_kv_head_count, s, self.attn_head_size)
        if not self.seq_length_is_variable:
            expected_q = (self.batch_size, self.attn_head_count, self.local_seq_length, self.attn_head_size)
            expected_kv = (self.batch_size, self.global_kv_head_count, self.local_seq_length, self.attn_head_size)
        if tuple(query.shape) != expected_q or tuple(key.shape) != expected_kv or tuple(value.shape) != expected_kv:
            raise SequenceParallelError(
                f"UlyssesSPAttentionHF on rank {dscomm.get_rank()}: q {tuple(query.shape)}, k {tuple(key.shape)}, "
                f"v {tuple(value.shape)}; expected q {expected_q} and k, v {expected_kv} ([batch, heads, local "
                f"sequence, head size], as registered)")

    # ------------------------------------------------------------------------------------------ registration
    @classmethod
    def register_with_transformers(cls, model_name_or_path: Any, core_attn_implementation: str,
                                   sequence_parallel_size: int, micro_batch_size: int, seq_length: int | None = None,
                                   seq_length_is_variable: bool = True, disable_in_eval: bool = False,
                                   max_length: int | None = None) -> Any:
        """Route `core_attn_implementation` of transformers through Ulysses over `sequence_parallel_size`
        ranks, and return the layout's groups (an `mpu` for initialize(mpu=...), with DeepSpeed's
        get_sequence_parallel_group() and friends), also registered as dscomm.groups' layout. None when
        sequence_parallel_size is 1. Collective: call it on every rank (torch.distributed started)."""
        if not isinstance(sequence_parallel_size, int) or isinstance(sequence_parallel_size, bool) \
                or sequence_parallel_size < 1:
            raise SequenceParallelError(f"register_with_transformers(sequence_parallel_size="
                                        f"{sequence_parallel_size!r}) must be a positive integer")
        if sequence_parallel_size == 1:
            return None
        if max_length is not None:
            logger.warning("register_with_transformers(max_length=...) is deprecated; use seq_length")
            seq_length = seq_length if seq_length is not None else max_length
        if not seq_length_is_variable and seq_length is None:
            raise SequenceParallelError("register_with_transformers: seq_length_is_variable=False needs seq_length "
                                        "(the fixed sequence length of every batch)")
        if seq_length is not None and seq_length % sequence_parallel_size:
            raise SequenceParallelError(f"register_with_transformers: seq_length {seq_length} is not divisible by "
                                        f"sequence_parallel_size {sequence_parallel_size}")
        try:
            from transformers import AutoConfig
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        except ImportError:
            raise SequenceParallelError("register_with_transformers needs transformers: pip install "
                                        "'dsseq[hf]'") from None
        config = getattr(model_name_or_path, "config", None)
        if config is None:
            config = AutoConfig.from_pretrained(model_name_or_path)
        model_impl = getattr(config, "_attn_implementation", None)
        if model_impl is not None and model_impl != core_attn_implementation:
            raise SequenceParallelError(f"register_with_transformers: core_attn_implementation "
                                        f"{core_attn_implementation!r} but the model's config uses {model_impl!r}; "
                                        f"set both to the same implementation so Ulysses wraps the one that runs")
        if core_attn_implementation in _NEEDS_4D_MASK:
            raise SequenceParallelError(f"register_with_transformers: {core_attn_implementation!r} attention takes "
                                        f"a mask built for each rank's slice (eager: a 4-D mask, quadratic in the "
                                        f"length), which cannot describe the whole sequence; use 'sdpa' or a "
                                        f"flash-attention implementation")
        original = _ORIGINALS.get(core_attn_implementation)
        if original is None:
            if core_attn_implementation not in ALL_ATTENTION_FUNCTIONS:
                valid = ", ".join(sorted(ALL_ATTENTION_FUNCTIONS.valid_keys()))
                raise SequenceParallelError(f"register_with_transformers: {core_attn_implementation!r} is not an "
                                            f"attention implementation of transformers; valid: {valid}")
            original = ALL_ATTENTION_FUNCTIONS[core_attn_implementation]
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        world = dscomm.get_world_size()
        if world % sequence_parallel_size:
            raise SequenceParallelError(f"register_with_transformers: sequence_parallel_size "
                                        f"{sequence_parallel_size} does not divide the world of {world} ranks")
        groups = dscomm.ParallelDims(world, sequence=sequence_parallel_size).build()  # collective
        uattn = cls(original, batch_size=micro_batch_size, attn_head_count=heads,
                    attn_head_size=getattr(text, "head_dim", None) or text.hidden_size // heads,
                    kv_head_count=getattr(text, "num_key_value_heads", None) or heads,
                    num_hidden_layers=text.num_hidden_layers, process_group=groups.sequence,
                    seq_length_is_variable=seq_length_is_variable,
                    local_seq_length=None if seq_length_is_variable else seq_length // sequence_parallel_size,
                    global_seq_length=None if seq_length_is_variable else seq_length,
                    disable_in_eval=disable_in_eval)
        uattn.core_attn_implementation = core_attn_implementation

        def ulysses_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
            return uattn(module, query, key, value, attention_mask, *args, **kwargs)

        ulysses_attention.ulysses = uattn  # type: ignore[attr-defined]
        _ORIGINALS[core_attn_implementation] = original
        ALL_ATTENTION_FUNCTIONS[core_attn_implementation] = ulysses_attention
        dscomm.groups.use(groups)
        return groups


def restore_transformers_attention() -> list[str]:
    """Put back transformers' own attention functions that register_with_transformers replaced; returns
    their names."""
    if not _ORIGINALS:
        return []
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    restored = sorted(_ORIGINALS)
    for name, function in _ORIGINALS.items():
        ALL_ATTENTION_FUNCTIONS[name] = function
    _ORIGINALS.clear()
    return restored


def _refuse_packed(positions: torch.Tensor, implementation: str | None) -> None:
    """Positions that do not step by one along a row mark packed documents, which `implementation`
    would attend across."""
    if positions.shape[-1] > 1 and bool((positions[..., 1:] - positions[..., :-1] != 1).any()):
        raise SequenceParallelError(
            f"Ulysses with {implementation!r} attention: the gathered position_ids restart inside a sample. Either "
            f"the forward call lacks position_ids (model(..., position_ids=...): each rank then numbers its slice "
            f"from 0; UlyssesSPDataLoaderAdapter / shard_batch keep them in the batch), or the sample packs several "
            f"documents, which {implementation!r} would attend across (it is causal over the whole row): use a "
            f"flash-attention implementation, which reads position_ids, or one document per sample")


def _whole_sequence_mask(mask: Any, implementation: str | None) -> Any:
    """The mask for the whole sequence: None, so the core attention is causal over it. Hugging Face passes
    None when every token is visible (no attention_mask, or one of all ones); any mask it built is of
    this rank's slice and stands for padding, which cannot be carried over the ranks: refused, never
    dropped."""
    if mask is None:
        return None
    shape = tuple(mask.shape) if hasattr(mask, "shape") else type(mask).__name__
    raise SequenceParallelError(
        f"Ulysses with {implementation!r} attention received an attention mask ({shape}) for this rank's slice of "
        f"the sequence: an attention_mask with padding cannot be carried over the sequence ranks; drop "
        f"attention_mask (or pass all ones) and give padded positions the label -100 (padding at the end of "
        f"each sample attends only to itself and earlier tokens)")
