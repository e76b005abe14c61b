"""DeepSpeed-Chat step 3 (PPO) on dstrain at ZeRO 0, 2 and 3 (dschat_ppo.py holds the iteration)."""

from __future__ import annotations

import dschat_ppo
import pytest
from hf_runs import tiny_llama

from dscomm.testing import run_ranks


def _every_stage(rank: int, world: int, model_dir: str) -> dict:
    return {stage: dschat_ppo.ppo_steps(stage, model_dir) for stage in (0, 2, 3)}


def test_a_deepspeed_chat_ppo_iteration_imports_and_trains_at_zero_0_2_and_3(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    results = run_ranks(_every_stage, 2, str(tmp_path), timeout=300)
    for rank in results:
        reference = rank[0]
        assert reference["norm_after"] != reference["norm_before"]  # the actor was updated
        for stage in (2, 3):
            # The same iterations partitioned differently: the same losses and the same updated actor.
            assert rank[stage]["losses"] == pytest.approx(reference["losses"], rel=1e-5, abs=1e-6), stage
            assert rank[stage]["norm_after"] == pytest.approx(reference["norm_after"], rel=1e-6), stage
        assert [rank[s]["ds_id"] for s in (0, 2, 3)] == [False, False, True]  # ZeRO-3 parameters carry ds_id
