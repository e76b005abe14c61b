"""The whole-tensor step (dszero.TensorShards): an optimizer that needs whole tensors runs at every stage.

The test optimizer below has both kinds of whole-tensor work: matrices move along a cubic Newton-Schulz
step of their normalised momentum (Muon's kind of update: it mixes every row and column) and vectors
along their gradient over its whole-tensor norm (a trust ratio, as Lamb's). At stages 1, 2 and 3 on 2 and 4
gloo ranks its parameters after 10 steps equal one rank at stage 0 (float64); each matrix is computed
by exactly one rank, owners are balanced, and only the pieces an owner lacks travel. With NVMe optimizer
offload, save_muon_momentum_buffer_in_memory keeps the momentum out of the swap file.
"""

import pytest
import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import OffloadOptimizerConfig, ZeroConfig
from dszero.whole_plan import ExchangePlan, assign_owners, held_range

STEPS, LR, MOMENTUM, GLOBAL_BATCH = 10, 0.02, 0.9, 8


def orthogonalish(matrix: torch.Tensor) -> torch.Tensor:
    # Smooth in its input (an exact polar factor is not where singular values are near zero).
    x = matrix / matrix.norm()
    return 1.5 * x - 0.5 * x @ x.mT @ x


class WholeTensorSGD(torch.optim.Optimizer):
    """Momentum SGD whose matrices step along orthogonalish(momentum) and vectors along g / ||g||."""

    def __init__(self, params, lr=LR, momentum=MOMENTUM):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self, closure=None):  # the same update on whole parameters: the reference without ZeRO
        for group in self.param_groups:
            for p in group["params"]:
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                update = orthogonalish(buf) if p.ndim == 2 else p.grad / p.grad.norm()
                p.add_(update, alpha=-group["lr"])

    @torch.no_grad()
    def step_on_shards(self, shards):
        matrices, vectors = {}, {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                matrices[p], vectors[p] = buf, p.grad
        updates = shards.transform_whole(matrices, lambda t, whole: orthogonalish(whole) if whole.ndim == 2 else whole * 0)
        (grad_sq,) = shards.sum_squares(vectors)
        for group in self.param_groups:
            for p in (p for p in group["params"] if p in matrices):
                update = updates[p]
                for index, tensor in enumerate(shards.tensors(p)):
                    if len(tensor.shape) != 2:
                        tensor.piece(update).copy_(tensor.piece(p.grad) / grad_sq[p][index].sqrt())
                p.add_(update, alpha=-group["lr"])


def train(model, step_fn, rank, world, zero=None):
    for micro_batches in batches(STEPS, 1, world, rank, micro_batch=GLOBAL_BATCH // world):
        loss = loss_of(model, micro_batches[0])
        if zero is None:
            loss.backward()
            step_fn()
            model.zero_grad()
        else:
            zero.backward(loss)
            zero.step()
            zero.zero_grad()


def wrapped(stage, config=None, precision="fp64"):
    model = make_model().double()
    zero = dszero.ZeroOptimizer(model, WholeTensorSGD(model.parameters()),
                                config or ZeroConfig(stage=stage, reduce_bucket_size=500), precision=precision)
    return model, zero


def full_params(model):
    with dszero.GatheredParameters(list(model.parameters())):
        return [p.detach().clone() for p in model.parameters()]


def stages_rank(rank, world, stages):
    results = {}
    for stage in stages:
        model, zero = wrapped(stage)
        train(model, None, rank, world, zero)
        masters = [g.master_param for g in zero.groups]
        plan = zero.tensor_shards.plans(masters)[0] if stage else None
        results[stage] = {"params": full_params(model), "computed": list(zero.tensor_shards.transformed),
                          "loads": plan.loads() if plan else None, "receive": plan.receive_sizes() if plan else None,
                          "owned_missing": _owned_missing(zero, plan) if plan else None}
    return results


def _owned_missing(zero, plan):
    """Elements of this rank's owned tensors that other ranks hold: all it should receive."""
    tensors = [t for g in zero.groups for t in zero.tensor_shards.tensors(g.master_param)]
    return sum(tensors[i].numel - (tensors[i].hi - tensors[i].lo) for i in plan.owned())


def reference_rank(rank, world):
    model, zero = wrapped(0)
    train(model, None, rank, world, zero)
    bare = make_model().double()
    optimizer = WholeTensorSGD(bare.parameters())
    train(bare, optimizer.step, rank, world)
    return full_params(model), [p.detach().clone() for p in bare.parameters()], list(zero.tensor_shards.transformed)


@pytest.fixture(scope="module")
def reference():
    (result,) = run_ranks(reference_rank, 1)
    return result


def test_stage_zero_on_one_rank_equals_the_bare_optimizer(reference):
    zero_params, bare_params, computed = reference
    for got, expected in zip(zero_params, bare_params, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    assert len(computed) == len(zero_params)  # stage 0 computes every tensor on every rank


@pytest.mark.parametrize("world", [2, 4])
def test_stages_1_2_3_equal_stage_0_on_one_rank(reference, world):
    per_rank = run_ranks(stages_rank, world, (1, 2, 3), timeout=180)
    expected = reference[0]
    names = [n for n, _ in make_model().named_parameters()]
    matrices = [n for n, p in make_model().named_parameters() if p.ndim == 2]
    for stage in (1, 2, 3):
        for rank_result in per_rank:
            for name, got, want in zip(names, rank_result[stage]["params"], expected, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=f"stage {stage}: {name}")
        # Each tensor's whole-tensor work ran on exactly one rank (the last step's record).
        computed = [name for r in per_rank for name in r[stage]["computed"]]
        assert sorted(computed) == sorted(names)
        assert {n for n in computed if n in matrices} == set(matrices)
        loads = per_rank[0][stage]["loads"]
        assert max(loads) - min(loads) <= max(p.numel() for p in make_model().parameters())
        for r in per_rank:  # an owner receives exactly the pieces of its tensors it does not hold
            assert sum(r[stage]["receive"]) == r[stage]["owned_missing"]


# ---------------------------------------------------------------------------------------------- the plan
def test_held_ranges_cover_each_tensor_once():
    for offset, numel, shard in [(0, 10, 4), (3, 9, 4), (7, 1, 4), (0, 12, 12)]:
        pieces = [held_range(offset, numel, shard, r) for r in range(6)]
        covered = sorted(i for lo, hi in pieces for i in range(lo, hi))
        assert covered == list(range(numel))


def test_owners_are_balanced_largest_first_and_prefer_the_holder():
    owners = assign_owners([100, 60, 50, 40, 10], [[0, 0]] * 5, 2)
    loads = [sum(n for n, o in zip([100, 60, 50, 40, 10], owners) if o == r) for r in range(2)]
    assert loads == [140, 120] or loads == [120, 140]
    assert assign_owners([8], [[0, 8]], 2) == [1]  # an equal choice goes to the rank holding it all


def test_every_rank_sends_what_its_peer_expects():
    tensors = [(0, 30, 20), (30, 25, 20), (55, 5, 20), (0, 7, 4), (7, 9, 4)]
    plans = [ExchangePlan.build(tensors, 4, r) for r in range(4)]
    for sender in range(4):
        for receiver in range(4):
            assert plans[sender].send_sizes()[receiver] == plans[receiver].receive_sizes()[sender]
    assert sorted(i for p in plans for i in p.owned()) == list(range(len(tensors)))


# ---------------------------------------------------------------------------------------------- NVMe
def nvme_rank(rank, world, root, keep):
    offload = OffloadOptimizerConfig(device="nvme", nvme_path=root, buffer_count=4, pin_memory=False)
    config = ZeroConfig(stage=3, offload_optimizer=offload, sub_group_size=2000,
                        save_muon_momentum_buffer_in_memory=keep)
    model, zero = wrapped(3, config)
    train(model, None, rank, world, zero)
    report = zero.memory_report()
    swapped = sorted(k for sub in zero.stepper.subgroups for k in sub.regions)
    state = zero.state_dict()["optimizer"]["state"]
    momentum_numel = sum(s["momentum_buffer"].numel() for s in state.values())
    return full_params(model), swapped, report, momentum_numel


def test_momentum_stays_in_memory_under_nvme_offload(tmp_path, reference):
    kept = run_ranks(nvme_rank, 2, str(tmp_path / "kept"), True, timeout=180)
    swapped = run_ranks(nvme_rank, 2, str(tmp_path / "swapped"), False, timeout=180)
    for params, regions, report, momentum in kept:
        for got, want in zip(params, reference[0], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        assert "momentum_buffer" not in set(regions)
        assert report["optimizer_state"] == momentum * 8  # float64, all of it in host memory
        assert report["nvme_bytes"] == report["master_weights"]
    for params, regions, report, momentum in swapped:
        for got, want in zip(params, reference[0], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        assert "momentum_buffer" in set(regions)
        assert report["optimizer_state"] == momentum * 8
        assert report["nvme_bytes"] == report["master_weights"] + momentum * 8
