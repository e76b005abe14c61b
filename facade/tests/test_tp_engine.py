"""AutoTP through initialize(): TP 2 x DP 2 on 4 gloo ranks with ZeRO 0, 1, 2 and 3 beside it trains a
tiny Llama as one process does (losses, clipped global gradient norm, parameters after the steps, in
float32); tp_overlap_comm composes too; tp_model_init records; layouts and a Megatron mpu are checked."""

import copy

import pytest
import torch
from tp_models import hf_model, tokens, tp_config, whole_parameters

import dscomm
import dstrain
from dscomm.testing import run_ranks

STEPS = 3


def reference(steps: int = STEPS, data: int = 2):
    model = hf_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    losses, norms = [], []
    for step in range(steps):
        ids = torch.cat([tokens(step, replica) for replica in range(data)])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, norms, dict((n, p.detach().clone()) for n, p in model.named_parameters())


def tp_rank(rank, world, stage, overlap, vocab=False):
    engine, *_ = dstrain.initialize(model=hf_model(), config=tp_config(2, stage, tp_overlap_comm=overlap,
                                                                        vocab_parallel_lm_head=vocab))
    groups = dscomm.groups.current()
    replica = groups.rank_in("data")
    losses, norms = [], []
    for step in range(STEPS):
        ids = tokens(step, replica)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total, group=groups.data)
        losses.append(total.item() / groups.size("data"))
        norms.append(engine.get_global_grad_norm())
    sharded = sum(1 for p in engine.module.parameters() if dscomm.is_tensor_parallel(p))
    return losses, norms, whole_parameters(engine), sharded, engine.dp_world_size


@pytest.mark.parametrize(("stage", "overlap", "vocab"), [(0, False, False), (1, True, False), (2, False, True),
                                                         (3, False, False), (3, True, True)])
def test_tp2_x_dp2_with_zero_equals_one_process(stage, overlap, vocab):
    ref_losses, ref_norms, ref_params = reference()
    for losses, norms, params, sharded, dp in run_ranks(tp_rank, 4, stage, overlap, vocab, timeout=240):
        assert dp == 2 and sharded > 0
        assert losses == pytest.approx(ref_losses, rel=1e-5), (stage, losses, ref_losses)
        assert norms == pytest.approx(ref_norms, rel=1e-4), (stage, norms, ref_norms)
        worst = max((params[n] - ref_params[n]).abs().max().item() for n in ref_params)
        assert worst < 2e-5, (stage, worst)


def recorded_rank(rank, world):
    results = []
    recorded = dstrain.tp_model_init(hf_model(), tp_size=4, dtype=torch.float32)  # records only: nothing is cut
    results.append(not any(dscomm.is_tensor_parallel(p) for p in recorded.parameters()))
    try:
        dstrain.initialize(model=copy.deepcopy(recorded), config=tp_config(2))
    except dstrain.ConfigError as exc:
        results.append("tp_model_init(tp_size=4)" in str(exc))
    try:
        dstrain.initialize(model=copy.deepcopy(recorded), config={**tp_config(0), "tensor_parallel": {}})
    except dstrain.ConfigError as exc:
        results.append('"autotp_size": 4' in str(exc))
    model = dstrain.tp_model_init(hf_model(), tp_size=2, dtype=torch.float32)
    engine, *_ = dstrain.initialize(model=model, config=tp_config(2))
    results.append(engine.dp_world_size == 1 and any(dscomm.is_tensor_parallel(p) for p in model.parameters()))
    results.append(engine.autotp_size() == 2)  # DeepSpeed's accessor: the config's tensor_parallel.autotp_size
    return results


def test_tp_model_init_records_and_the_config_must_agree():
    for results in run_ranks(recorded_rank, 2, timeout=120):
        assert results == [True] * 5


class MegatronMPU:
    """A Megatron-style mpu over dscomm's layout of the same shape (what Megatron-DeepSpeed passes)."""

    def __init__(self, groups, swap=False):
        self.groups, self.swap = groups, swap

    def get_model_parallel_world_size(self):
        return self.groups.size("tensor")

    def get_tensor_model_parallel_group(self):
        return self.groups.data if self.swap else self.groups.tensor

    def get_data_parallel_group(self):
        return self.groups.tensor if self.swap else self.groups.data


def mpu_rank(rank, world):
    theirs = dscomm.ParallelDims(world, tensor=2).build()
    config = {k: v for k, v in tp_config(0).items() if k != "tensor_parallel"}
    model = hf_model()
    engine, *_ = dstrain.initialize(model=model, config=config, mpu=MegatronMPU(theirs))
    accepted = (engine.dp_world_size, engine.optimizer.process_group is dscomm.groups.current().data)
    try:
        dstrain.initialize(model=hf_model(), config=config, mpu=MegatronMPU(theirs, swap=True))
        refused = False
    except dstrain.UnsupportedFeatureError as exc:
        refused = "mpu" in str(exc) and "ranks" in str(exc)
    return accepted, refused


def test_a_megatron_mpu_sets_the_tensor_axis_and_its_groups_must_match_the_layout():
    for accepted, refused in run_ranks(mpu_rank, 4, timeout=120):
        assert accepted == (2, True) and refused


def consolidated_rank(rank, world):
    model = hf_model()
    expected = {name: value.clone() for name, value in model.state_dict().items()}
    engine, *_ = dstrain.initialize(model=model, model_parameters=model.parameters(), config=tp_config(2))
    state = engine._consolidated_16bit_state_dict()  # Accelerate's get_state_dict under AutoTP
    sharded = any(p.shape != expected[n].shape for n, p in model.named_parameters())
    if state is None:
        return rank, sharded, None
    return rank, sharded, {n: torch.equal(state[n], expected[n]) for n in expected} | {"keys": set(state) == set(expected)}


def no_partition_rank(rank, world):
    model = hf_model()
    engine, *_ = dstrain.initialize(model=model, model_parameters=model.parameters(), config=tp_config(1))
    try:
        engine._consolidated_16bit_state_dict()
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_the_consolidated_state_dict_merges_tensor_parallel_shards_on_rank_0():
    results = {rank: (sharded, equal) for rank, sharded, equal in run_ranks(consolidated_rank, 2)}
    assert results[0][0] and results[1][0]  # the module's weights are shards on both ranks
    assert results[1][1] is None and results[0][1] and all(results[0][1].values()), results[0][1]
    (message,) = run_ranks(no_partition_rank, 1)
    assert "ZeRO stage 3 or tensor_parallel.autotp_size > 1" in message
