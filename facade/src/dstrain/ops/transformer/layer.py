"""DeepSpeedTransformerLayer: a BERT encoder layer with DeepSpeed's parameters, on the fused kernels.

The math, as DeepSpeed's CUDA layer computes it (GeLU is the tanh approximation):

    pre-LN:  a = x + drop(attn(LN(x; norm_w, norm_b)) @ attn_ow^T + attn_ob)
             out = a + drop(gelu(LN(a; attn_nw, attn_nb) @ inter_w^T + inter_b) @ output_w^T + output_b)
    post-LN: a = LN(x + drop(attn(x) @ attn_ow^T + attn_ob); attn_nw, attn_nb)
             out = LN(a + drop(gelu(a @ inter_w^T + inter_b) @ output_w^T + output_b); norm_w, norm_b)

attn(h) splits h @ attn_qkvw^T + attn_qkvb into Q, K, V (rows 0:H, H:2H, 2H:3H of attn_qkvw) and heads,
and takes drop(softmax(Q K^T / sqrt(H / heads) + mask)) V. The mask is BERT's additive one ([batch, 1, 1,
seq]: 0 to attend, a large negative number to ignore).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import DstrainError
from ..kernels import attention, bias_dropout_residual, bias_gelu, bias_gelu_linear, layer_norm
from .config import DeepSpeedTransformerConfig, check_buildable

# The order of DeepSpeed's initial_weights / initial_biases lists (q, k and v go into attn_qkvw / attn_qkvb).
_WEIGHT_SLOTS = ("q", "k", "v", "attn_ow", "attn_nw", "inter_w", "output_w", "norm_w")
_BIAS_SLOTS = ("q", "k", "v", "attn_ob", "attn_nb", "inter_b", "output_b", "norm_b")
_SEED_LIMIT = 2**31 - 8  # Triton's Philox takes 32-bit seeds; each call uses seed, seed + 1, seed + 2
_UNSUPPORTED_ARGS = ("head_mask", "layer_head_mask", "encoder_hidden_states", "encoder_attention_mask",
                     "past_key_value")


def _mix(*values: int) -> int:
    """A well-spread 31-bit seed from a few ints (splitmix64 steps)."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        state = (state ^ (state >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (state >> 33) % _SEED_LIMIT


class DeepSpeedTransformerLayer(nn.Module):
    """A BERT encoder layer with DeepSpeed's API and parameter layout; a DeepSpeed state dict loads as is.

    layer_id (class attribute) counts the layers built in this process, as DeepSpeed's does; with
    config.seed >= 0 it separates the layers' dropout masks. initial_weights / initial_biases are
    DeepSpeed's test-only lists of 8 (q, k, v, attention output, attention norm, intermediate, output,
    norm); unlike DeepSpeed, the q, k, v biases given are used rather than zeroed.
    """

    layer_id = 0

    def __init__(self, config: DeepSpeedTransformerConfig, initial_weights=None, initial_biases=None):
        super().__init__()
        initializes = initial_weights is None or initial_biases is None
        check_buildable(config, initializes)
        self.config = config
        self.layer_id = DeepSpeedTransformerLayer.layer_id  # the instance keeps its own: configs get shared
        config.layer_id = self.layer_id
        DeepSpeedTransformerLayer.layer_id += 1
        self._dropout_calls = 0
        if config.local_rank >= 0 and torch.cuda.is_available():
            torch.cuda.set_device(config.local_rank)

        hidden, inter = config.hidden_size, config.intermediate_size
        shapes = {"attn_qkvw": (3 * hidden, hidden), "attn_qkvb": (3 * hidden,), "attn_ow": (hidden, hidden),
                  "attn_ob": (hidden,), "attn_nw": (hidden,), "attn_nb": (hidden,), "inter_w": (inter, hidden),
                  "inter_b": (inter,), "output_w": (hidden, inter), "output_b": (hidden,), "norm_w": (hidden,),
                  "norm_b": (hidden,)}
        for name, shape in shapes.items():
            setattr(self, name, nn.Parameter(torch.zeros(shape)))
        if initializes:
            self.init_transformer_weights(config.adjust_init_range)
        if initial_weights is not None:
            self._adopt(initial_weights, _WEIGHT_SLOTS, "attn_qkvw", "initial_weights", shapes)
        if initial_biases is not None:
            self._adopt(initial_biases, _BIAS_SLOTS, "attn_qkvb", "initial_biases", shapes)

    def _adopt(self, given, slots, fused_qkv: str, argument: str, shapes) -> None:
        if len(given) != len(slots):
            raise DstrainError(f"{argument} has {len(given)} tensors; DeepSpeed's layout has {len(slots)}: "
                               f"{', '.join(slots)}")
        hidden = self.config.hidden_size
        expected = {**{slot: (hidden, hidden) if fused_qkv.endswith("w") else (hidden,) for slot in "qkv"},
                    **{slot: shapes[slot] for slot in slots[3:]}}
        for index, (slot, tensor) in enumerate(zip(slots, given)):
            if tuple(tensor.shape) != expected[slot]:
                raise DstrainError(f"{argument}[{index}] ({slot}) has shape {tuple(tensor.shape)}; expected "
                                   f"{expected[slot]} for hidden_size {hidden}, intermediate_size "
                                   f"{self.config.intermediate_size}")
        setattr(self, fused_qkv, nn.Parameter(torch.cat([t.detach() for t in given[:3]]).clone()))
        for slot, tensor in zip(slots[3:], given[3:]):  # DeepSpeed takes these very Parameters over
            setattr(self, slot, tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor.detach().clone()))

    def init_transformer_weights(self, adjust_init_range: bool = False) -> None:
        """BERT's init: normal(0, initializer_range) weights, zero biases, unit norms; with adjust_init_range
        the two output projections use initializer_range / sqrt(2 * num_hidden_layers).

        DeepSpeed applies the adjustment only where local_rank == 0 (so not at its default -1); here it
        follows the documented flag alone.
        """
        std = self.config.initializer_range
        output_std = std / math.sqrt(2.0 * self.config.num_hidden_layers) if adjust_init_range else std
        with torch.no_grad():
            for weight, scale in ((self.attn_qkvw, std), (self.attn_ow, output_std), (self.inter_w, std),
                                  (self.output_w, output_std)):
                weight.normal_(mean=0.0, std=scale)
            for bias in (self.attn_qkvb, self.attn_ob, self.attn_nb, self.inter_b, self.output_b, self.norm_b):
                bias.zero_()
            self.attn_nw.fill_(1.0)
            self.norm_w.fill_(1.0)

    def _call_seed(self) -> int:
        if self.config.seed >= 0:
            self._dropout_calls += 1
            return _mix(self.config.seed, self.layer_id, self._dropout_calls)
        return int(torch.randint(0, _SEED_LIMIT, (1,)).item())

    def forward(self, hidden_states, attention_mask=None, head_mask=None, layer_head_mask=None,
                encoder_hidden_states=None, encoder_attention_mask=None, past_key_value=None,
                output_attentions=False, grads=None):
        given = {"head_mask": head_mask, "layer_head_mask": layer_head_mask,
                 "encoder_hidden_states": encoder_hidden_states, "encoder_attention_mask": encoder_attention_mask,
                 "past_key_value": past_key_value}
        for name in _UNSUPPORTED_ARGS:
            if given[name] is not None:
                raise DstrainError(f"DeepSpeedTransformerLayer.forward: {name} is not supported (DeepSpeed's "
                                   "layer ignores it too); pass None")
        if output_attentions:
            raise DstrainError("DeepSpeedTransformerLayer.forward: output_attentions=True is not supported "
                               "(the kernel returns the layer output only)")
        if grads is not None:
            raise DstrainError("DeepSpeedTransformerLayer.forward: grads (DeepSpeed's test-only gradient list) is "
                               "not supported; read the parameters' .grad after backward")
        config = self.config
        config.training, config.is_grad_enabled = self.training, torch.is_grad_enabled()
        mask = self._check_inputs(hidden_states, attention_mask)
        attn_p = config.attn_dropout_ratio if self.training else 0.0
        hidden_p = config.hidden_dropout_ratio if self.training else 0.0
        seed = self._call_seed() if attn_p > 0 or hidden_p > 0 else 0
        output = transformer_layer(
            hidden_states, mask, self, heads=config.heads, pre_layer_norm=config.pre_layer_norm,
            eps=config.layer_norm_eps, attn_p=attn_p, hidden_p=hidden_p, seed=seed,
            normalize_invertible=config.normalize_invertible,
            attn_dropout_checkpoint=config.attn_dropout_checkpoint, gelu_checkpoint=config.gelu_checkpoint)
        return (output,) if config.return_tuple else output

    def _check_inputs(self, hidden_states: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        hidden = self.config.hidden_size
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != hidden:
            raise DstrainError(f"DeepSpeedTransformerLayer: hidden_states has shape {tuple(hidden_states.shape)}; "
                               f"expected [batch, seq, {hidden}]")
        if hidden_states.dtype != self.attn_qkvw.dtype:
            raise DstrainError(f"DeepSpeedTransformerLayer: hidden_states is {hidden_states.dtype} but the "
                               f"parameters are {self.attn_qkvw.dtype}; convert one (model.half(), .to(dtype))")
        if mask is None:
            return None
        batch, seq = hidden_states.shape[:2]
        if mask.dtype == torch.bool or not mask.is_floating_point():
            raise DstrainError(f"DeepSpeedTransformerLayer: attention_mask is {mask.dtype}; it is BERT's additive "
                               "float mask (0 to attend, -10000 to ignore), e.g. (1.0 - mask[:, None, None, :]) "
                               "* -10000.0")
        if mask.shape[-1] != seq or any(s != 1 for s in mask.shape[1:-1]) or mask.shape[0] not in (1, batch) \
                or mask.dim() < 2:
            raise DstrainError(f"DeepSpeedTransformerLayer: attention_mask has shape {tuple(mask.shape)}; expected "
                               f"[batch, 1, 1, seq] = [{batch}, 1, 1, {seq}] (one additive value per key)")
        return mask.reshape(mask.shape[0], seq).expand(batch, seq).contiguous()


def transformer_layer(x: torch.Tensor, mask: torch.Tensor | None, params, *, heads: int, pre_layer_norm: bool,
                      eps: float, attn_p: float, hidden_p: float, seed: int, normalize_invertible: bool = False,
                      attn_dropout_checkpoint: bool = False, gelu_checkpoint: bool = False) -> torch.Tensor:
    """The layer as a function of x [batch, seq, hidden], the mask as [batch, seq] (or None), an object
    holding the 12 parameters by DeepSpeed's names, and one dropout seed (its three sites use seed,
    seed + 1, seed + 2)."""
    batch, seq, hidden = x.shape
    head_dim = hidden // heads
    p = params
    attn_in = layer_norm(x, p.norm_w, p.norm_b, eps, normalize_invertible) if pre_layer_norm else x
    qkv = F.linear(attn_in, p.attn_qkvw, p.attn_qkvb)
    # [batch, seq, 3, heads, head_dim] -> 3 x [batch, heads, seq, head_dim], one contiguous copy
    q, k, v = qkv.view(batch, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
    context = attention(q, k, v, mask, 1.0 / math.sqrt(head_dim), attn_p, seed, attn_dropout_checkpoint)
    context = context.transpose(1, 2).reshape(batch, seq, hidden)
    attended = bias_dropout_residual(F.linear(context, p.attn_ow), p.attn_ob, x, hidden_p, seed + 1)
    ff_in = layer_norm(attended, p.attn_nw, p.attn_nb, eps, normalize_invertible)
    up = F.linear(ff_in, p.inter_w)
    if gelu_checkpoint:
        down = bias_gelu_linear(up, p.inter_b, p.output_w)
    else:
        down = F.linear(bias_gelu(up, p.inter_b), p.output_w)
    out = bias_dropout_residual(down, p.output_b, attended if pre_layer_norm else ff_in, hidden_p, seed + 2)
    return out if pre_layer_norm else layer_norm(out, p.norm_w, p.norm_b, eps, normalize_invertible)
