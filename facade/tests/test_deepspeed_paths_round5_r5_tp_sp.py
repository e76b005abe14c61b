"""DeepSpeed names its own unit tests use (issue 35, round 5), resolved under the alias and used:
`deepspeed.runtime.tensor_parallel.config._get_hf_tp_plan` (runtime/test_tp_plan_extraction.py: the plan a Hugging
Face model carries, as AutoTP reads it) and `deepspeed.runtime.utils.move_to_device`
(ulysses_alst/test_ulysses_sp_hf.py moves its batches with it) and `deepspeed.runtime.utils.is_model_parallel_parameter`
(model_parallelism/test_tp_plan_e2e.py: a shard AutoTP cut, a Megatron-marked one, not a replicated one). One subprocess: the alias is process-wide."""

import pytest
from alias_snippet import run_alias_snippet

pytest.importorskip("dstp")

SNIPPET = r"""
import dstrain.as_deepspeed
import torch
import deepspeed.runtime.tensor_parallel as tensor_parallel
from deepspeed.runtime.tensor_parallel.config import _get_hf_tp_plan
from deepspeed.runtime.utils import is_model_parallel_parameter, move_to_device
import dstp

assert _get_hf_tp_plan is dstp.hf_tp_plan and tensor_parallel.config._get_hf_tp_plan is dstp.hf_tp_plan

class Config:
    base_model_tp_plan = {"layers.*.self_attn.q_proj": "colwise"}

class Model:
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self):
        self.config = Config()
        self._tp_plan = {"model.layers.*.self_attn.q_proj": "colwise"}

assert _get_hf_tp_plan(Model()) == {"layers.*.self_attn.q_proj": "colwise", "lm_head": "colwise_gather_output"}
assert _get_hf_tp_plan(torch.nn.Linear(2, 2)) is None

batch = {"ids": torch.ones(2, dtype=torch.int64), "more": [torch.zeros(1), (torch.ones(1, dtype=torch.float64),)]}
moved = move_to_device(batch, "meta")
assert moved["ids"].device.type == "meta" and moved["more"][1][0].device.type == "meta"
assert isinstance(moved["more"], list) and isinstance(moved["more"][1], tuple)
assert batch["ids"].device.type == "cpu"  # copies, the caller's tensors left where they were
kept, moved_in_place = torch.zeros(2), torch.zeros(2, dtype=torch.float64)
out = move_to_device([kept, moved_in_place], "cpu", criterion_func=lambda t: t.dtype == torch.float64)
assert out[0] is kept and out[1] is moved_in_place  # the chosen one moved in place (its .data), the other left
marked = torch.nn.Parameter(torch.zeros(2))
assert not is_model_parallel_parameter(marked)
marked.tensor_model_parallel = True  # as Megatron marks its shards
assert is_model_parallel_parameter(marked)

import dscomm
shard = torch.nn.Parameter(torch.zeros(2))
setattr(shard, dscomm.TENSOR_PARALLEL_ATTR, True)  # what dstp sets on a weight AutoTP cut
assert is_model_parallel_parameter(shard)
print("ok")
"""


def test_round5_tp_sp_paths_resolve_under_the_alias_and_work(tmp_path):
    run_alias_snippet(SNIPPET, tmp_path)
