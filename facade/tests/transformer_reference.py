"""A BERT encoder layer written from torch.nn, the yardstick for DeepSpeedTransformerLayer, with the maps
between its parameters and DeepSpeed's names (as DeepSpeed's own tests build theirs)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class ReferenceBertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, inter: int, pre_layer_norm: bool, eps: float = 1e-12,
                 attn_p: float = 0.0, hidden_p: float = 0.0):
        super().__init__()
        self.heads, self.pre_layer_norm = heads, pre_layer_norm
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)  # DeepSpeed's attn_nw / attn_nb
        self.intermediate = nn.Linear(hidden, inter)
        self.output = nn.Linear(inter, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)  # DeepSpeed's norm_w / norm_b
        self.attn_dropout, self.hidden_dropout = nn.Dropout(attn_p), nn.Dropout(hidden_p)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = t.shape
        return t.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm(x) if self.pre_layer_norm else x
        q, k, v = self._split(self.query(h)), self._split(self.key(h)), self._split(self.value(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores + mask
        context = (self.attn_dropout(torch.softmax(scores, dim=-1)) @ v).transpose(1, 2).reshape(x.shape)
        attended = x + self.hidden_dropout(self.attn_out(context))
        if not self.pre_layer_norm:
            attended = self.attn_norm(attended)
        ff_in = self.attn_norm(attended) if self.pre_layer_norm else attended
        out = attended + self.hidden_dropout(self.output(F.gelu(self.intermediate(ff_in), approximate="tanh")))
        return out if self.pre_layer_norm else self.norm(out)

    def deepspeed_view(self) -> dict[str, torch.Tensor]:
        """This layer's parameters under DeepSpeed's names (q, k, v fused), detached."""
        return {"attn_qkvw": torch.cat([self.query.weight, self.key.weight, self.value.weight]),
                "attn_qkvb": torch.cat([self.query.bias, self.key.bias, self.value.bias]),
                "attn_ow": self.attn_out.weight, "attn_ob": self.attn_out.bias,
                "attn_nw": self.attn_norm.weight, "attn_nb": self.attn_norm.bias,
                "inter_w": self.intermediate.weight, "inter_b": self.intermediate.bias,
                "output_w": self.output.weight, "output_b": self.output.bias,
                "norm_w": self.norm.weight, "norm_b": self.norm.bias}

    def deepspeed_grads(self) -> dict[str, torch.Tensor]:
        """The gradients of deepspeed_view's tensors."""
        grads = {}
        for name, param in {"attn_ow": self.attn_out.weight, "attn_ob": self.attn_out.bias,
                            "attn_nw": self.attn_norm.weight, "attn_nb": self.attn_norm.bias,
                            "inter_w": self.intermediate.weight, "inter_b": self.intermediate.bias,
                            "output_w": self.output.weight, "output_b": self.output.bias,
                            "norm_w": self.norm.weight, "norm_b": self.norm.bias}.items():
            grads[name] = param.grad
        grads["attn_qkvw"] = torch.cat([self.query.weight.grad, self.key.weight.grad, self.value.weight.grad])
        grads["attn_qkvb"] = torch.cat([self.query.bias.grad, self.key.bias.grad, self.value.bias.grad])
        return grads

    def randomize(self, generator: torch.Generator) -> None:
        """Weights and biases all non-trivial (norm weights near 1), so every gradient path is exercised."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
                param.copy_(1.0 + 0.1 * noise if "norm" in name and name.endswith("weight") else 0.2 * noise)
