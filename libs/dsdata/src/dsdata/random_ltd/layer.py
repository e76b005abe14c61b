"""`RandomLayerTokenDrop`: a layer wrapper that, in training, runs the layer on a random sorted subset of
each sample's tokens and passes the other tokens through unchanged."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import DataEfficiencyError
from .ops import gather_encoder_mask, gather_tokens, sample_token_indices, scatter_tokens, slice_decoder_mask
from .scheduler import BASE, RandomLTDScheduler

WRAPPED = "random_ltd_layer"  # DeepSpeed's name of the wrapped layer (its state_dict keys carry it; ours do not)


class RandomLayerTokenDrop(nn.Module):
    """Wraps `layer`; `init_config` turns token dropping on for it (until then, and in eval, it is the layer).

    The first random-LTD layer of a forward draws every random-LTD layer's kept tokens at once
    ([layers, batch, reserved], shared through the scheduler) and each layer takes its own row, as
    DeepSpeed does. The layer's inputs other than the hidden states must be passed as keywords; the
    attention mask (config model_mask_name) is sliced (decoder) or gathered (encoder) to the kept tokens.

    The wrapper adds no name: the layer's parameters, buffers and submodules are the wrapper's own (the
    same dictionaries), so parameter and state_dict names are those of the unconverted model, and a
    checkpoint or an optimizer built before or after conversion matches either way (DeepSpeed inserts
    ".random_ltd_layer" into every name; such state dicts load here too). The layer is
    `wrapper.random_ltd_layer`; its other attributes read through the wrapper.
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        object.__setattr__(self, "_wrapped_layer", layer)  # not a submodule: its children are the wrapper's
        self._parameters = layer._parameters
        self._buffers = layer._buffers
        self._non_persistent_buffers_set = layer._non_persistent_buffers_set
        self._modules = layer._modules
        self.training = layer.training
        self.random_ltd_scheduler: RandomLTDScheduler | None = None
        self.random_ltd_layer_id = -1  # position among the random-LTD layers; -1: not configured
        self.random_ltd_num_layer = 0
        self.mask_name: str | None = None
        self.model_type = "decoder"
        self.batch_first = True
        self.reserved_length = -1
        self.curr_seq = -1
        self.register_load_state_dict_pre_hook(_accept_deepspeed_keys)

    @property
    def random_ltd_layer(self) -> nn.Module:
        return self.__dict__["_wrapped_layer"]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "_wrapped_layer" not in self.__dict__:
                raise
            return getattr(self.__dict__["_wrapped_layer"], name)

    def train(self, mode: bool = True) -> RandomLayerTokenDrop:
        super().train(mode)  # the shared submodules
        self.random_ltd_layer.training = mode
        return self

    def init_config(self, config: Any, scheduler: RandomLTDScheduler, random_ltd_layer_id: int) -> None:
        """Drop tokens in this layer, the `random_ltd_layer_id`-th random-LTD layer of the model (0: the first,
        which draws the kept tokens of all of them), following `scheduler`'s reserved length."""
        from ..curriculum_scheduler import config_as_dict

        section = config_as_dict(config)
        order = section.get("hidden_state_order")
        if order not in ("batch_seq_dim", "seq_batch_dim"):
            raise DataEfficiencyError(f"{BASE}.hidden_state_order must be 'batch_seq_dim' or 'seq_batch_dim', got "
                                      f"{order!r}")
        model_type = section.get("model_type")
        if model_type not in ("decoder", "encoder"):
            raise DataEfficiencyError(f"{BASE}.model_type must be 'decoder' or 'encoder', got {model_type!r}")
        if not 0 <= random_ltd_layer_id < scheduler.random_ltd_layer_num:
            raise DataEfficiencyError(f"random-LTD layer position {random_ltd_layer_id} is outside "
                                      f"0..{scheduler.random_ltd_layer_num - 1} ({BASE}.random_ltd_layer_num)")
        self.random_ltd_scheduler = scheduler
        self.random_ltd_layer_id = random_ltd_layer_id
        self.random_ltd_num_layer = scheduler.random_ltd_layer_num
        self.mask_name = section.get("model_mask_name")
        self.model_type = model_type
        self.batch_first = order == "batch_seq_dim"

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        scheduler = self.random_ltd_scheduler
        if scheduler is None or not self.training:
            return self.random_ltd_layer(hidden_states, *args, **kwargs)
        self.reserved_length = scheduler.get_current_seq()
        self.curr_seq, batch = (hidden_states.shape[1], hidden_states.shape[0]) if self.batch_first \
            else hidden_states.shape[:2]
        if self.random_ltd_layer_id == 0:
            scheduler.observed_seq_length = self.curr_seq
        if self.reserved_length >= self.curr_seq:
            return self.random_ltd_layer(hidden_states, *args, **kwargs)
        if args:
            raise DataEfficiencyError(f"random-LTD passes the layer's inputs other than the hidden states by keyword; "
                                      f"{type(self.random_ltd_layer).__name__} got {len(args)} more positional "
                                      f"argument(s): call it with keywords (e.g. attention_mask=...)")
        indices = self._kept_tokens(scheduler, batch, hidden_states.device)
        if self.mask_name is not None and kwargs.get(self.mask_name) is not None:
            mask = kwargs[self.mask_name]
            kwargs[self.mask_name] = slice_decoder_mask(mask, self.reserved_length) if self.model_type == "decoder" \
                else gather_encoder_mask(mask, indices, self.curr_seq)
        part = gather_tokens(hidden_states, indices, self.batch_first)
        outputs = self.random_ltd_layer(part, **kwargs)
        if torch.is_tensor(outputs):
            return scatter_tokens(hidden_states, outputs, indices, self.batch_first)
        if isinstance(outputs, tuple) and outputs and torch.is_tensor(outputs[0]):
            return (scatter_tokens(hidden_states, outputs[0], indices, self.batch_first), *outputs[1:])
        raise DataEfficiencyError(f"random-LTD needs the layer to return its hidden states as a tensor or as the "
                                  f"first item of a tuple; {type(self.random_ltd_layer).__name__} returned "
                                  f"{type(outputs).__name__}")

    def _kept_tokens(self, scheduler: RandomLTDScheduler, batch: int, device: torch.device) -> torch.Tensor:
        shape = (self.random_ltd_num_layer, batch, self.reserved_length)
        if self.random_ltd_layer_id == 0 or scheduler.sampled_indices is None \
                or tuple(scheduler.sampled_indices.shape) != shape:
            scheduler.sampled_indices = sample_token_indices(self.reserved_length, self.curr_seq, batch,
                                                             self.random_ltd_num_layer, device)
        return scheduler.sampled_indices[self.random_ltd_layer_id]

    def extra_repr(self) -> str:
        what = type(self.random_ltd_layer).__name__
        if self.random_ltd_scheduler is None:
            return f"{what}, token dropping off"
        return f"{what}, random-LTD layer {self.random_ltd_layer_id} of {self.random_ltd_num_layer}, {self.model_type}"


def _accept_deepspeed_keys(module: nn.Module, state_dict: dict, prefix: str, *_: Any) -> None:
    # A DeepSpeed random-LTD state dict names this layer's entries "<prefix>random_ltd_layer.<name>".
    wrapped = f"{prefix}{WRAPPED}."
    for key in [k for k in state_dict if k.startswith(wrapped)]:
        state_dict[prefix + key[len(wrapped):]] = state_dict.pop(key)
