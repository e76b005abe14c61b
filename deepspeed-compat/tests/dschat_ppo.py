"""A DeepSpeed-Chat step-3 (PPO) iteration written the way DeepSpeed-Chat writes it, with its imports: the
actor and critic are trained engines, the reference and reward models are engines without an optimizer (at
ZeRO-3 too, where they stay partitioned), models load through `from_pretrained` under `HfDeepSpeedConfig`,
sequences come from `actor.module.generate(synced_gpus=...)`, and ZeRO-3 parameters are fetched by
`ZeroParamStatus`. Runs inside a rank of dscomm.testing.run_ranks. (Without the Hybrid Engine: its own issue.)"""

from __future__ import annotations

from typing import Any

import deepspeed
import deepspeed.comm as dist
import torch
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from deepspeed.compression.helper import recursive_getattr, recursive_setattr
from deepspeed.ops.adam import FusedAdam
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.integrations.deepspeed import HfDeepSpeedConfig

PROMPT, ANSWER, MICRO = 4, 6, 2


def train_config(stage: int) -> dict[str, Any]:
    """DeepSpeed-Chat's training config (get_train_ds_config), hybrid engine and TensorBoard off."""
    return {"train_batch_size": MICRO * dist.get_world_size(), "train_micro_batch_size_per_gpu": MICRO,
            "steps_per_print": 10,
            "zero_optimization": {"stage": stage, "overlap_comm": True, "offload_param": {"device": "none"},
                                  "offload_optimizer": {"device": "none"}, "stage3_param_persistence_threshold": 1e4,
                                  "stage3_max_live_parameters": 3e7, "stage3_prefetch_bucket_size": 3e7,
                                  "memory_efficient_linear": False},
            "gradient_clipping": 1.0, "prescale_gradients": False, "wall_clock_breakdown": False,
            "hybrid_engine": {"enabled": False, "max_out_tokens": 512, "inference_tp_size": 1,
                              "release_inference_cache": False, "pin_parameters": True, "tp_gather_partition_size": 8},
            "tensorboard": {"enabled": False, "output_path": "ds_tensorboard_logs/", "job_name": "step3"}}


def eval_config(stage: int) -> dict[str, Any]:
    """DeepSpeed-Chat's inference config (get_eval_ds_config)."""
    return {"train_batch_size": MICRO * dist.get_world_size(), "train_micro_batch_size_per_gpu": MICRO,
            "steps_per_print": 10,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 1e4,
                                  "offload_param": {"device": "none"}, "memory_efficient_linear": False},
            "gradient_clipping": 1.0, "prescale_gradients": False, "wall_clock_breakdown": False}


class ValueModel(torch.nn.Module):
    """DeepSpeed-Chat's RewardModel shape: a transformer body and a scalar head, read by forward_value."""

    def __init__(self, body: torch.nn.Module):
        super().__init__()
        self.config = body.config
        torch.manual_seed(2)  # the head's start is the same whatever the loading before it drew
        self.v_head = torch.nn.Linear(body.config.hidden_size, 1, bias=False)
        self.rwtransformer = body

    def forward_value(self, input_ids, attention_mask=None, return_value_only=False, prompt_length=0, use_cache=False):
        values = self.v_head(self.rwtransformer(input_ids, attention_mask=attention_mask, use_cache=use_cache)[0])
        values = values.squeeze(-1)
        if return_value_only:
            return values
        last = attention_mask.sum(1) - 1
        return {"values": values, "chosen_end_scores": values.gather(1, last.unsqueeze(1)).squeeze(1)}


class LoRALinear(torch.nn.Module):
    """DeepSpeed-Chat's LoRA layer shape: the original weight (partitioned at ZeRO-3: ds_shape gives its size)
    beside a low-rank update, every parameter trained."""

    def __init__(self, weight: torch.nn.Parameter, rank: int = 2):
        super().__init__()
        rows, columns = weight.ds_shape if hasattr(weight, "ds_shape") else weight.shape
        self.weight = weight
        self.lora_right_weight = torch.nn.Parameter(torch.zeros(columns, rank))
        self.lora_left_weight = torch.nn.Parameter(torch.zeros(rank, rows))
        torch.manual_seed(1)
        torch.nn.init.normal_(self.lora_right_weight, std=0.02)

    def forward(self, x):
        return F.linear(x, self.weight) + (x @ self.lora_right_weight) @ self.lora_left_weight


def load_state_dict_into_model(model: torch.nn.Module, state_dict: dict, zero_stage: int) -> None:
    """DeepSpeed-Chat's loader for a model built from its config: at ZeRO-3 each module's parameters are
    gathered, rank 0 loads them and its values reach every shard (modifier_rank=0)."""
    def load(module: torch.nn.Module, prefix: str = "") -> None:
        args = (state_dict, prefix, {}, True, [], [], [])
        if zero_stage == 3:
            own = dict(module.named_parameters(prefix=prefix[:-1], recurse=False))
            present = [param for name, param in own.items() if name in state_dict]
            if present:
                with deepspeed.zero.GatheredParameters(present, modifier_rank=0):
                    if torch.distributed.get_rank() == 0:
                        module._load_from_state_dict(*args)
        else:
            module._load_from_state_dict(*args)
        for name, child in module._modules.items():
            if child is not None:
                load(child, f"{prefix}{name}.")

    load(model)


def params_to_fetch(params) -> list[torch.nn.Parameter]:
    return [p for p in params if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]


def model_norm(model: torch.nn.Module) -> float:
    total = 0.0
    with torch.no_grad():
        for param in model.parameters():
            with deepspeed.zero.GatheredParameters(param, enabled=bool(params_to_fetch([param]))):
                total += float(param.float().norm())
    return total


def log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def ppo_steps(stage: int, model_dir: str, steps: int = 2) -> dict[str, Any]:
    """`steps` PPO iterations at `stage` (the reference and reward models at 3 when it is 3, else 0)."""
    eval_stage = 3 if stage == 3 else 0
    keep = []  # HfDeepSpeedConfig objects must stay alive while their models load (a weak reference is kept)
    if stage == 3:
        keep.append(HfDeepSpeedConfig(train_config(stage)))
    actor = AutoModelForCausalLM.from_pretrained(model_dir)
    recursive_setattr(actor, "lm_head", LoRALinear(recursive_getattr(actor, "lm_head.weight")))
    actor_engine, *_ = deepspeed.initialize(model=actor, config=train_config(stage),
                                            optimizer=FusedAdam(actor.parameters(), lr=1e-3, betas=(0.9, 0.95)))
    # The critic as DeepSpeed-Chat makes it for RLHF: built from its config (under zero.Init at ZeRO-3), then
    # its weights loaded module by module.
    body = AutoModel.from_config(AutoConfig.from_pretrained(model_dir))
    weights = load_file(f"{model_dir}/model.safetensors")
    load_state_dict_into_model(body, {k.removeprefix("model."): v for k, v in weights.items()}, stage)
    critic = ValueModel(body)
    critic_engine, *_ = deepspeed.initialize(model=critic, config=train_config(stage),
                                             optimizer=FusedAdam(critic.parameters(), lr=1e-3, betas=(0.9, 0.95)))
    keep.append(HfDeepSpeedConfig(eval_config(eval_stage)) if eval_stage == 3 else None)
    ref_engine, *_ = deepspeed.initialize(model=AutoModelForCausalLM.from_pretrained(model_dir),
                                          config=eval_config(eval_stage))
    reward_engine, *_ = deepspeed.initialize(model=ValueModel(AutoModel.from_pretrained(model_dir)),
                                             config=eval_config(eval_stage))
    norm_before = model_norm(actor_engine)
    generator = torch.Generator().manual_seed(1234 + dist.get_rank())
    prompts = torch.randint(3, 64, (MICRO, PROMPT), generator=generator).to(get_accelerator().current_device_name())
    losses = []
    for _ in range(steps):
        for engine in (actor_engine, critic_engine, ref_engine, reward_engine):
            engine.eval()
        with torch.no_grad():  # experience
            seq = actor_engine.module.generate(prompts, attention_mask=torch.ones_like(prompts),
                                               max_length=PROMPT + ANSWER, pad_token_id=0, do_sample=False,
                                               synced_gpus=stage == 3)
            mask = seq.ne(0).long()
            old_logp = log_probs(actor_engine(seq, attention_mask=mask).logits[:, :-1], seq[:, 1:])
            ref_logp = log_probs(ref_engine(seq, attention_mask=mask).logits[:, :-1], seq[:, 1:])
            score = reward_engine.forward_value(seq, mask, prompt_length=PROMPT)["chosen_end_scores"]
            old_values = critic_engine.forward_value(seq, mask, return_value_only=True)[:, :-1]
        actor_engine.train()
        critic_engine.train()
        start = PROMPT - 1
        rewards = -0.1 * (old_logp - ref_logp)
        rewards[:, -1] += score.clamp(-5, 5)
        advantages = rewards[:, start:] - old_values[:, start:]
        returns = advantages + old_values[:, start:]
        logp = log_probs(actor_engine(seq, attention_mask=mask, use_cache=False).logits[:, :-1], seq[:, 1:])
        ratio = torch.exp(logp[:, start:] - old_logp[:, start:])
        actor_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean()
        actor_engine.backward(actor_loss)
        actor_engine.step()
        values = critic_engine.forward_value(seq, attention_mask=mask, return_value_only=True, use_cache=False)
        critic_loss = 0.5 * ((values[:, :-1][:, start:] - returns) ** 2).mean()
        critic_engine.backward(critic_loss)
        critic_engine.step()
        losses += [actor_loss.item(), critic_loss.item()]
    return {"losses": losses, "norm_before": norm_before, "norm_after": model_norm(actor_engine),
            "ds_id": hasattr(next(actor_engine.module.parameters()), "ds_id")}
