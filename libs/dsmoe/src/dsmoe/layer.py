"""DeepSpeed's `deepspeed.moe.layer.MoE`: the Mixture-of-Experts layer a model is built with.

    moe = MoE(hidden_size=512, expert=MLP(512, 2048), num_experts=8, ep_size=2, k=1)
    output, l_aux, exp_counts = moe(hidden_states)

The layer learns its process groups after construction, as DeepSpeed's does: `dstrain.initialize`
calls `set_expert_groups` (or a script calls `set_deepspeed_parallelism()`, which asks dscomm's group
getters). Until then a layer with ep_size 1 runs alone and one with ep_size > 1 refuses to run.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import dscomm
from dscomm import expert_group_name

from .errors import MoEError
from .experts import Experts
from .sharded_moe import MOELayer, TopKGate

LOGGER = logging.getLogger("dsmoe")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class MoE(nn.Module):
    """A Mixture-of-Experts layer with DeepSpeed's arguments.

    hidden_size: the input and output dimension. expert: the module each expert copies (an MLP).
    num_experts: experts in the layer, over all ranks. ep_size: ranks the experts are spread over
    (each holds num_experts / ep_size). k: experts per token (1, 2 or more). capacity_factor /
    eval_capacity_factor: slots per expert relative to an even share, in training / eval.
    min_capacity: the fewest slots per expert. use_residual: PR-MoE's Residual MoE (a dense copy of
    `expert` beside the experts, mixed per token by a learned 2-way softmax). noisy_gate_policy:
    None, 'Jitter' (input noise) or 'RSample' (Gumbel noise on top-1 choices). drop_tokens=False:
    no token is ever dropped (capacity = the busiest expert's load). use_rts: random token selection
    when an expert overflows (False: first come in sequence order). top2_2nd_expert_sampling: sample
    the second expert of a top-2 gate. Beyond DeepSpeed's: `generator` for every random draw (None:
    torch's default one) and `dispatch` ("auto", "dense" or "sparse").
    """

    def __init__(self, hidden_size: int, expert: nn.Module, num_experts: int = 1, ep_size: int = 1, k: int = 1,
                 capacity_factor: float = 1.0, eval_capacity_factor: float = 1.0, min_capacity: int = 4,
                 use_residual: bool = False, noisy_gate_policy: str | None = None, drop_tokens: bool = True,
                 use_rts: bool = True, use_tutel: bool = False, enable_expert_tensor_parallelism: bool = False,
                 top2_2nd_expert_sampling: bool = True, *, generator: torch.Generator | None = None,
                 dispatch: str = "auto") -> None:
        super().__init__()
        for name, value in (("num_experts", num_experts), ("ep_size", ep_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MoEError(f"MoE: {name}={value!r} must be a positive integer")
        if num_experts % ep_size:
            raise MoEError(f"MoE: num_experts {num_experts} is not divisible by ep_size {ep_size}: each of the "
                           f"{ep_size} expert-parallel ranks must hold the same number of experts; ep_size must be "
                           f"one of {_divisors(num_experts)}")
        if enable_expert_tensor_parallelism:
            raise MoEError("MoE: enable_expert_tensor_parallelism=True needs tensor-parallel experts, which dsmoe "
                           "does not provide; leave it False (experts are whole on each rank)")
        if use_tutel:
            warnings.warn("MoE: use_tutel=True: Tutel is not used here; the layer's own dispatch runs (DeepSpeed "
                          "does the same when Tutel is not installed)", stacklevel=2)
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = False
        self.ep_size = ep_size
        self.expert_group_name = expert_group_name(ep_size)
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        self.expert_data_group: Any = None
        LOGGER.debug("MoE layer: %d experts, %d local, expert-parallel size %d", num_experts,
                     self.num_local_experts, ep_size)
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor, min_capacity,
                        noisy_gate_policy, drop_tokens, use_rts, None, top2_2nd_expert_sampling, generator=generator)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size, self.num_local_experts,
                                      dispatch=dispatch)
        if use_residual:
            self.mlp = expert  # the dense path of Residual MoE: the original, not an expert copy
            self.coefficient = nn.Linear(hidden_size, 2)

    # ------------------------------------------------------------------------------ groups
    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        """Take the expert groups of this layer's ep_size from dscomm's group getters (collective the
        first time an ep_size is asked for)."""
        if use_data_before_expert_parallel_:
            raise MoEError("MoE.set_deepspeed_parallelism(use_data_before_expert_parallel_=True): expert groups "
                           "here are consecutive data-parallel ranks (dscomm.ParallelDims); leave it False")
        data = dscomm.groups.get_data_parallel_world_size()
        check_expert_parallel_size(self.ep_size, data, self.num_experts)
        self.set_expert_groups(dscomm.groups.get_expert_parallel_group(self.ep_size),
                               dscomm.groups.get_expert_data_parallel_group(self.ep_size))

    def set_expert_groups(self, expert_group: Any, expert_data_group: Any = None) -> None:
        """The ep_size ranks that split this layer's experts (`expert_group`) and the ranks holding the
        same experts as this one (`expert_data_group`, over which their gradients are reduced). The
        local experts take their global ids from this rank's place in `expert_group`."""
        size = dist.get_world_size(expert_group) if expert_group is not None else 1
        if size != self.ep_size:
            raise MoEError(f"MoE.set_expert_groups: the expert-parallel group has {size} rank(s) but the layer's "
                           f"ep_size is {self.ep_size}; give a group of {self.ep_size} ranks")
        ep_rank = dist.get_rank(expert_group) if expert_group is not None else 0
        self.deepspeed_moe._set_ep_group(expert_group)
        self.deepspeed_moe.experts.deepspeed_experts.renumber(ep_rank * self.num_local_experts)
        self.expert_data_group = expert_data_group

    def global_expert_ids(self) -> list[int]:
        """The global ids of the experts this rank holds."""
        return self.deepspeed_moe.experts.deepspeed_experts.global_ids()

    # ------------------------------------------------------------------------------ forward
    def forward(self, hidden_states: torch.Tensor, used_token: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, l_aux: the load-balancing loss, exp_counts: tokens routed to each expert)."""
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            if isinstance(dense, tuple):
                dense = dense[0]  # an MLP returning (output, bias): the output
            mix = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * mix[..., 0:1] + dense * mix[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts


def check_expert_parallel_size(ep_size: int, data_parallel_size: int, num_experts: int | None = None,
                               where: str = "MoE") -> None:
    """Refuse an ep_size the data-parallel ranks cannot be split into, with the numbers."""
    if ep_size > data_parallel_size or data_parallel_size % ep_size:
        valid = [d for d in _divisors(data_parallel_size) if num_experts is None or num_experts % d == 0]
        raise MoEError(f"{where}: ep_size {ep_size} does not divide the {data_parallel_size} data-parallel rank(s) "
                       f"(ep_size > world, or not a divisor of it); valid ep_size values here: {valid}")
