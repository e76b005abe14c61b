"""DeepSpeed's `deepspeed.runtime.domino` names, for scripts that build Domino layers by hand (the
DeepSpeedExamples Domino GPT): a transformer layer that runs two half-batches, issuing each half's
row-parallel all-reduce asynchronously so it overlaps the other half's compute, and whose column-parallel
input-gradient all-reduces are waited for only where the gradient is needed (`DominoUtil.HANDLE_DIC`).

Layout as Megatron's: activations are [sequence, batch, hidden]; the fused query_key_value weight holds
[q, k, v] per head, heads split whole over the tensor group; `mpu` gives the tensor group and its size.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import Parameter

import dscomm

from .errors import TensorParallelError


class LayerType(enum.Enum):
    encoder = 1
    decoder = 2


class AttnType(enum.Enum):
    self_attn = 1
    cross_attn = 2


class AttnMaskType(enum.Enum):
    padding = 1
    causal = 2


class ModelType(enum.Enum):
    encoder_or_decoder = 1
    encoder_and_decoder = 2


class DominoUtil:
    """The handles of the two half-batches' input-gradient all-reduces, by half."""

    BATCH_0 = "BATCH0"
    BATCH_1 = "BATCH1"
    HANDLE_DIC: ClassVar[dict[str, Any]] = {"BATCH0": None, "BATCH1": None}


class DominoModule(nn.Module):
    """The base of Domino's modules (DeepSpeed's name)."""


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class _WaitBackward(torch.autograd.Function):
    """Identity forward; backward waits for the half's pending input-gradient all-reduce."""

    @staticmethod
    def forward(ctx, x, handle_dic, h_id):
        ctx.handle_dic, ctx.h_id = handle_dic, h_id
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        handle = ctx.handle_dic.get(ctx.h_id)
        if handle is not None:
            handle.wait()
            ctx.handle_dic[ctx.h_id] = None
        return grad, None, None


def _Wait_bwd_comm(input_: torch.Tensor, dic_: dict, h_id: str) -> torch.Tensor:
    return _WaitBackward.apply(input_, dic_, h_id)


NoOper = _WaitBackward


class _AsyncColumnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, handle_dic, h_id, group):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.handle_dic, ctx.h_id, ctx.group = bias is not None, handle_dic, h_id, group
        y = torch.matmul(x, weight.t())
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_input = torch.matmul(grad, weight).contiguous()
        # The sum over the tensor group runs while the weight gradient is computed and beyond: the wait
        # is in the half's _Wait_bwd_comm node, where the input gradient is first needed.
        ctx.handle_dic[ctx.h_id] = dscomm.all_reduce(grad_input, group=ctx.group, async_op=True,
                                                     log_name="domino_input_grad")
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = flat_grad.t().matmul(x.reshape(-1, x.shape[-1]))
        grad_bias = flat_grad.sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None, None


def _parameter(shape: tuple[int, ...], config: Any, init: Callable | None) -> Parameter:
    dtype = getattr(config, "params_dtype", torch.float32)
    param = Parameter(torch.empty(*shape, device=_device(), dtype=dtype))
    if getattr(config, "perform_initialization", True):
        if init is not None and len(shape) > 1:
            init(param)
        else:
            with torch.no_grad():
                param.zero_()
    return param


class DominoAsyncColumnParallelLinear(DominoModule):
    """A column-parallel linear whose input-gradient all-reduce is asynchronous; forward takes the
    handle dictionary and the half's id and returns (output, bias or None)."""

    def __init__(self, input_size: int, output_size: int, _tp_group: Any, config: Any, init_method: Callable,
                 bias: bool = True, skip_bias_add: bool = False):
        super().__init__()
        self.tp_group = _tp_group
        self.skip_bias_add = skip_bias_add
        self.weight = _parameter((output_size, input_size), config, init_method)
        self.bias = _parameter((output_size,), config, None) if bias else None

    def forward(self, input_: torch.Tensor, handle_dic: dict, h_id: str) -> tuple[torch.Tensor, Any]:
        bias = None if self.skip_bias_add else self.bias
        output = _AsyncColumnLinear.apply(input_, self.weight, bias, handle_dic, h_id, self.tp_group)
        return output, (self.bias if self.skip_bias_add else None)


class RowParallelLinearNoComm(DominoModule):
    """A row-parallel linear that leaves the all-reduce of its partial output to the caller (the Domino
    layer issues it asynchronously); returns (output, bias or None)."""

    def __init__(self, input_size: int, output_size: int, config: Any, init_method: Callable, bias: bool = True,
                 stride: int = 1, skip_bias_add: bool = False):
        super().__init__()
        self.skip_bias_add = skip_bias_add
        self.weight = _parameter((output_size, input_size), config, init_method)
        self.bias = _parameter((output_size,), config, None) if bias else None

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, Any]:
        bias = None if self.skip_bias_add else self.bias
        return F.linear(input_, self.weight, bias), (self.bias if self.skip_bias_add else None)


class CoreAttention(DominoModule):
    def __init__(self, config: Any, tp_world_size: int, attn_mask_type: AttnMaskType = AttnMaskType.causal):
        super().__init__()
        projection = config.kv_channels * config.num_attention_heads
        if projection % tp_world_size:
            raise TensorParallelError(f"Domino: projection size {projection} (kv_channels x num_attention_heads) does "
                                      f"not split over {tp_world_size} tensor ranks")
        self.hidden_size_per_partition = projection // tp_world_size
        self.dropout = config.attention_dropout

    def forward(self, query, key, value, attention_mask):
        context = F.scaled_dot_product_attention(query, key, value, dropout_p=self.dropout if self.training else 0.0,
                                                 is_causal=True)
        context = context.permute(2, 0, 1, 3).contiguous()  # [b, np, s, hn] -> [s, b, np, hn]
        return context.view(*context.shape[:-2], self.hidden_size_per_partition)


class ShardedAttention(DominoModule):
    """Self-attention with whole heads per tensor rank (causal only, as DeepSpeed's)."""

    def __init__(self, config: Any, mpu: Any, apply_rotary_pos_emb: Callable | None, layer_number: int,
                 attention_type: AttnType = AttnType.self_attn, attn_mask_type: AttnMaskType = AttnMaskType.causal):
        super().__init__()
        if attention_type != AttnType.self_attn:
            raise TensorParallelError("Domino ShardedAttention supports self attention only")
        tp = mpu.get_tensor_model_parallel_world_size()
        heads = config.num_attention_heads
        if heads % tp:
            raise TensorParallelError(f"Domino: num_attention_heads {heads} does not split over {tp} tensor ranks")
        self.apply_rotary_pos_emb = apply_rotary_pos_emb
        self.head_dim = config.kv_channels
        self.heads_per_partition = heads // tp
        projection = config.kv_channels * heads
        self.query_key_value = DominoAsyncColumnParallelLinear(config.hidden_size, 3 * projection // tp,
                                                               mpu.get_tensor_model_parallel_group(), config,
                                                               config.init_method, bias=config.add_bias_linear)
        self.core_attention = CoreAttention(config, tp, attn_mask_type)
        self.dense = RowParallelLinearNoComm(projection // tp, config.hidden_size, config,
                                             config.output_layer_init_method, bias=config.add_bias_linear,
                                             skip_bias_add=True)

    def core(self, mixed: torch.Tensor, attention_mask: Any, rotary_pos_emb: Any = None) -> torch.Tensor:
        mixed = mixed.view(*mixed.shape[:-1], self.heads_per_partition, 3 * self.head_dim)
        mixed = mixed.permute(1, 2, 0, 3).contiguous()  # [s, b, np, 3hn] -> [b, np, s, 3hn]
        query, key, value = torch.split(mixed, [self.head_dim] * 3, dim=3)
        if rotary_pos_emb is not None and self.apply_rotary_pos_emb is not None:
            q_emb, k_emb = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            query, key = self.apply_rotary_pos_emb(query, q_emb), self.apply_rotary_pos_emb(key, k_emb)
        return self.core_attention(query, key, value, attention_mask)

    def forward(self, hidden_states, attention_mask, micro_batch_num, rotary_pos_emb=None):
        mixed, _ = self.query_key_value(hidden_states, DominoUtil.HANDLE_DIC, micro_batch_num)
        return self.dense(self.core(mixed, attention_mask, rotary_pos_emb))


class bias_dropout_add(nn.Module):
    def __init__(self, prob: float):
        super().__init__()
        self.dropout = nn.Dropout(prob)

    def forward(self, x, bias, residual):
        return self.dropout(x + bias if bias is not None else x) + residual


class DominoTransformerLayer(DominoModule):
    """One transformer layer over two half-batches ([s, b/2, h] each): while one half's row-parallel
    all-reduce is in flight the other half computes; returns the two halves."""

    def __init__(self, config: Any, mpu: Any, apply_rotary_pos_emb: Callable | None, layer_number: int,
                 layer_type: LayerType = LayerType.encoder, self_attn_mask_type: AttnMaskType = AttnMaskType.causal,
                 drop_path_rate: float = 0.0):
        super().__init__()
        self.layer_number = layer_number
        self.post_layernorm_residual = config.apply_residual_connection_post_layernorm
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon, device=_device(),
                                            dtype=getattr(config, "params_dtype", None))
        self.self_attention = ShardedAttention(config, mpu, apply_rotary_pos_emb, layer_number,
                                               attn_mask_type=self_attn_mask_type)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon,
                                                     device=_device(), dtype=getattr(config, "params_dtype", None))
        tp = mpu.get_tensor_model_parallel_world_size()
        self.TP_group = mpu.get_tensor_model_parallel_group()
        if config.ffn_hidden_size % tp:
            raise TensorParallelError(f"Domino: ffn_hidden_size {config.ffn_hidden_size} does not split over {tp} "
                                      f"tensor ranks")
        self.linear_fc1 = DominoAsyncColumnParallelLinear(config.hidden_size, config.ffn_hidden_size // tp,
                                                          self.TP_group, config, config.init_method,
                                                          bias=config.add_bias_linear)
        self.mlp_activation_func = F.gelu
        self.linear_fc2 = RowParallelLinearNoComm(config.ffn_hidden_size // tp, config.hidden_size, config,
                                                  config.output_layer_init_method, bias=config.add_bias_linear,
                                                  skip_bias_add=True)
        self.bias_dropout_add_func = bias_dropout_add(config.hidden_dropout)

    def _reduce(self, tensor: torch.Tensor) -> Any:
        return dscomm.all_reduce(tensor.detach(), group=self.TP_group, async_op=True, log_name="domino_row")

    def _attention_input(self, hidden, half):
        normed = _Wait_bwd_comm(self.input_layernorm(hidden), DominoUtil.HANDLE_DIC, half)
        return normed

    def _mlp_input(self, attention, bias, normed, hidden, half):
        residual = normed if self.post_layernorm_residual else hidden
        mid = self.bias_dropout_add_func(attention, bias, residual)
        normed2 = _Wait_bwd_comm(self.post_attention_layernorm(mid), DominoUtil.HANDLE_DIC, half)
        return normed2, (normed2 if self.post_layernorm_residual else mid)

    def forward(self, hidden_states, attention_mask, rotary_pos_emb=None):
        hidden0, hidden1 = hidden_states
        halves = (DominoUtil.BATCH_0, DominoUtil.BATCH_1)
        normed0 = self._attention_input(hidden0, halves[0])
        attention0, bias0 = self.self_attention(normed0, attention_mask, halves[0], rotary_pos_emb)
        handle0 = self._reduce(attention0)
        normed1 = self._attention_input(hidden1, halves[1])
        attention1, bias1 = self.self_attention(normed1, attention_mask, halves[1], rotary_pos_emb)
        handle1 = self._reduce(attention1)
        handle0.wait()
        mlp_in0, residual0 = self._mlp_input(attention0, bias0, normed0, hidden0, halves[0])
        out0 = self.mlp_activation_func(self.linear_fc1(mlp_in0, DominoUtil.HANDLE_DIC, halves[0])[0])
        handle1.wait()
        mlp_in1, residual1 = self._mlp_input(attention1, bias1, normed1, hidden1, halves[1])
        down0, fc2_bias = self.linear_fc2(out0)
        handle0 = self._reduce(down0)
        out1 = self.mlp_activation_func(self.linear_fc1(mlp_in1, DominoUtil.HANDLE_DIC, halves[1])[0])
        down1, _ = self.linear_fc2(out1)
        handle1 = self._reduce(down1)
        handle0.wait()
        hidden0 = self.bias_dropout_add_func(down0, fc2_bias, residual0)
        handle1.wait()
        hidden1 = self.bias_dropout_add_func(down1, fc2_bias, residual1)
        return hidden0, hidden1


class DominoTransformer(DominoModule):
    """Layers of DominoTransformerLayer over a [s, b, h] input split into two half-batches."""

    def __init__(self, config: Any, mpu: Any, apply_rotary_pos_emb: Callable | None, model_type: Any = None,
                 layer_type: LayerType = LayerType.encoder, self_attn_mask_type: AttnMaskType = AttnMaskType.causal,
                 post_layer_norm: bool = True, pre_process: bool = True, post_process: bool = True,
                 drop_path_rate: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(DominoTransformerLayer(config, mpu, apply_rotary_pos_emb, i + 1, layer_type,
                                                           self_attn_mask_type) for i in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon, device=_device(),
                                            dtype=getattr(config, "params_dtype", None)) \
            if post_process and post_layer_norm else None

    def forward(self, hidden_states, attention_mask, rotary_pos_emb=None):
        halves = torch.chunk(hidden_states, 2, dim=1)
        for layer in self.layers:
            halves = layer(halves, attention_mask, rotary_pos_emb)
        if self.final_layernorm is not None:
            halves = tuple(self.final_layernorm(h) for h in halves)
        return torch.cat(halves, dim=1)
