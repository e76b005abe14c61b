"""vocab_parallel_lm_head: the LM head keeps its vocabulary rows cut over the group and the causal-LM
loss is computed from each rank's slice of the logits, never gathering them.

Per token: the maximum logit and the sum of exponentials are all-reduced (two numbers per token),
and the target's logit comes from the rank that holds its row; the gradient of the slice is
softmax - one-hot, computed locally.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import dscomm

from .comm import TensorGroup


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, tensor_group: TensorGroup, vocab_start: int, ignore_index: int):
        local = logits.shape[-1]
        group = tensor_group.group
        maximum = logits.max(dim=-1).values
        dscomm.all_reduce(maximum, op=dscomm.ReduceOp.MAX, group=group, log_name="tp_vocab_max")
        shifted = logits - maximum.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        in_slice = (target >= vocab_start) & (target < vocab_start + local)
        index = (target - vocab_start).clamp(0, local - 1)
        picked = shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1) * in_slice
        stats = torch.stack([sum_exp, picked])
        dscomm.all_reduce(stats, group=group, log_name="tp_vocab_loss")
        sum_exp, picked = stats[0], stats[1]
        loss = sum_exp.log() - picked
        valid = target != ignore_index
        loss = loss * valid
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, index, in_slice & valid, valid)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, index, hit, valid = ctx.saved_tensors
        grad = softmax * (grad_loss * valid).unsqueeze(-1)
        grad.scatter_add_(-1, index.unsqueeze(-1), -(grad_loss * hit).unsqueeze(-1).to(grad.dtype))
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tensor_group: TensorGroup,
                                 vocab_start: int, ignore_index: int = -100) -> torch.Tensor:
    """Per-token cross-entropy of vocabulary-sliced logits (..., V / tp); 0 where target is ignore_index."""
    return _VocabParallelCrossEntropy.apply(logits, target, tensor_group, vocab_start, ignore_index)


class VocabParallelCausalLMLoss:
    """A Hugging Face `loss_function` (ForCausalLMLoss's arguments) for vocabulary-sliced logits."""

    def __init__(self, tensor_group: TensorGroup, vocab_start: int):
        self.tensor_group = tensor_group
        self.vocab_start = vocab_start

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor | None = None, vocab_size: int | None = None,
                 num_items_in_batch: Any = None, ignore_index: int = -100, shift_labels: torch.Tensor | None = None,
                 **kwargs: Any) -> torch.Tensor:
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # as ForCausalLMLoss: the loss in float32 at least
        if shift_labels is None:
            if labels is None:
                raise ValueError("the vocab-parallel loss needs labels or shift_labels")
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        target = shift_labels.reshape(-1).to(logits.device)
        losses = vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]), target, self.tensor_group,
                                              self.vocab_start, ignore_index)
        if num_items_in_batch is not None:
            total = num_items_in_batch.to(losses.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
            return losses.sum() / total
        return losses.sum() / (target != ignore_index).sum().clamp(min=1)
