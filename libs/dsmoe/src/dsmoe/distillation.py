"""Mixture-of-Students (MoS, the MoE-for-NLG tutorial): a smaller student MoE learns from a trained
teacher's logits by knowledge distillation, in stages: distillation stops at `stop_step`, after which
the student trains on the language-modelling loss alone (distilling to the end hurt the student).

The distillation term is Megatron-DeepSpeed's: temperature^2 x KL(teacher || student) over the
vocabulary at temperature T, averaged over token positions, times `kd_weight`:

    loss = lm_weight x lm_loss + kd_weight x T^2 x mean_tokens KL(softmax(t / T) || softmax(s / T))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .errors import MoEError


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
                      ) -> torch.Tensor:
    """T^2 x KL(softmax(teacher / T) || softmax(student / T)), summed over the last (vocabulary) axis
    and averaged over every other position. The teacher's logits get no gradient."""
    if student_logits.shape != teacher_logits.shape:
        raise MoEError(f"distillation_loss: student logits {tuple(student_logits.shape)} and teacher logits "
                       f"{tuple(teacher_logits.shape)} must have the same shape (same vocabulary and tokens)")
    if not temperature > 0:
        raise MoEError(f"distillation_loss: temperature must be positive, got {temperature}")
    vocab = student_logits.shape[-1]
    student = F.log_softmax(student_logits.float().reshape(-1, vocab) / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.detach().float().reshape(-1, vocab) / temperature, dim=-1)
    per_token = F.kl_div(student, teacher, reduction="sum", log_target=True) / student.shape[0]
    return per_token * temperature * temperature


class MixtureOfStudents:
    """The staged distillation recipe: `teacher` (frozen, in eval mode) gives logits while
    step < stop_step (None: never stops); `loss()` mixes them in, then returns the LM loss alone."""

    def __init__(self, teacher: nn.Module, *, temperature: float = 1.0, kd_weight: float = 1.0,
                 lm_weight: float = 1.0, stop_step: int | None = None):
        if stop_step is not None and (not isinstance(stop_step, int) or isinstance(stop_step, bool) or stop_step < 0):
            raise MoEError(f"MixtureOfStudents: stop_step={stop_step!r} must be a non-negative integer or None")
        if not temperature > 0:
            raise MoEError(f"MixtureOfStudents: temperature must be positive, got {temperature}")
        self.teacher = teacher
        self.temperature = temperature
        self.kd_weight = kd_weight
        self.lm_weight = lm_weight
        self.stop_step = stop_step
        teacher.eval()
        for param in teacher.parameters():
            param.requires_grad_(False)

    def distilling(self, step: int) -> bool:
        """Whether the optimizer step `step` (counted from 0) still distills."""
        return self.stop_step is None or step < self.stop_step

    @torch.no_grad()
    def teacher_logits(self, *inputs: Any, **kwargs: Any) -> torch.Tensor:
        out = self.teacher(*inputs, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def loss(self, lm_loss: torch.Tensor, student_logits: torch.Tensor, step: int, *teacher_inputs: Any,
             teacher_logits: torch.Tensor | None = None) -> torch.Tensor:
        """lm_weight x lm_loss + kd_weight x distillation_loss while distilling, else lm_loss. The
        teacher runs on `teacher_inputs` unless its logits are given (and only while distilling)."""
        if not self.distilling(step):
            return lm_loss
        if teacher_logits is None:
            teacher_logits = self.teacher_logits(*teacher_inputs)
        kd = distillation_loss(student_logits, teacher_logits, self.temperature)
        return self.lm_weight * lm_loss + self.kd_weight * kd
