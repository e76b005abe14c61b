"""Expert parameter groups reload at another expert-parallel size.

A rank's expert group holds only the experts it holds, so at another expert-parallel size the same
experts sit in other groups, beside other experts, partitioned over another expert-data group. The
checkpoint finds each parameter by name wherever it was saved: 4 gloo ranks save at ep_size 2
(stages 1 and 2, AdamW), then load at ep_size 4 and 1; every element of every master weight and of
both Adam moments equals what was saved, and so does the step count.
"""

import pytest
import torch
from torch import nn

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

WORLD, EXPERTS = 4, 4


def build(ep: int):
    """A dense layer and this rank's experts, registered under their global ids; its ZeroOptimizer groups."""
    groups = dscomm.ParallelDims(WORLD, expert=ep).build()
    torch.manual_seed(0)
    dense = nn.Linear(3, 5)
    local = EXPERTS // ep
    first = groups.rank_in("expert") * local
    experts = nn.ModuleDict({str(e): nn.Linear(5, 2) for e in range(first, first + local)})
    for e, expert in experts.items():  # every expert's start depends on its global id only
        torch.manual_seed(100 + int(e))
        expert.reset_parameters()
    model = nn.ModuleDict({"dense": dense, "experts": experts})
    param_groups = [{"params": list(dense.parameters())},
                    {"params": list(experts.parameters()), "moe": True, "name": f"ep_size_{ep}",
                     "process_group": groups.expert_data, "gradient_average_over": WORLD}]
    return groups, model, param_groups


def pieces(zero) -> dict[str, list]:
    """{parameter name: [(start, end, master, exp_avg, exp_avg_sq, step)]} of this rank's shards."""
    found: dict[str, list] = {}
    for flat in zero.groups:
        state = zero.optimizer.state[flat.master_param]
        base, _ = flat.layout.shard_range(flat.shard_rank)
        for slot, lo, hi in flat.layout.pieces_in_shard(flat.shard_rank):
            at = slice(slot.offset + lo - base, slot.offset + hi - base)
            found.setdefault(slot.name, []).append(
                (lo, hi, flat.master[at].clone(), state["exp_avg"][at].clone(), state["exp_avg_sq"][at].clone(),
                 float(state["step"])))
    return found


def ranks(rank, world, stage, directory):
    _, model, param_groups = build(2)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(param_groups, lr=0.1), ZeroConfig(stage=stage))
    for step in range(2):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 * step + rank))
        hidden = model["dense"](x)
        loss = sum(expert(hidden).pow(2).mean() for expert in model["experts"].values())
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
    saved = pieces(zero)
    zero.save(directory)
    loaded = {}
    for ep in (4, 1):
        _, fresh, fresh_groups = build(ep)
        other = dszero.ZeroOptimizer(fresh, torch.optim.AdamW(fresh_groups, lr=0.1), ZeroConfig(stage=stage))
        other.load(directory)
        loaded[ep] = pieces(other)
        weights = {name: param.detach().clone() for name, param in fresh.named_parameters()}
        loaded[ep]["__weights__"] = weights
    return saved, loaded


def assemble(results, which: int | None = None):
    """Every parameter's full tensors (master, exp_avg, exp_avg_sq) from every rank's pieces."""
    full: dict[str, list[torch.Tensor]] = {}
    for saved, loaded in results:
        source = saved if which is None else loaded[which]
        for name, parts in source.items():
            if name == "__weights__":
                continue
            for lo, hi, *values, _step in parts:
                # 64 elements hold any parameter here; elements no rank holds stay NaN and fail the comparison
                slots = full.setdefault(name, [torch.full((64,), float("nan")) for _ in range(3)])
                for slot, value in zip(slots, values, strict=True):
                    slot[lo:hi] = value
    return full


@pytest.mark.parametrize("stage", [1, 2])
def test_expert_groups_reload_at_another_expert_parallel_size(tmp_path, stage):
    results = run_ranks(ranks, WORLD, stage, str(tmp_path / "ckpt"), timeout=180)
    saved = assemble(results)
    assert {name.split(".")[1] for name in saved if name.startswith("experts.")} == {"0", "1", "2", "3"}
    for ep in (4, 1):
        loaded = assemble(results, ep)
        assert loaded.keys() == saved.keys()
        for name in saved:
            for got, want in zip(loaded[name], saved[name], strict=True):
                torch.testing.assert_close(got, want, equal_nan=True, msg=f"ep {ep}: {name}")
        for rank, (_saved, by_ep) in enumerate(results):
            assert {p[-1] for parts in by_ep[ep].values() if isinstance(parts, list) for p in parts} == {2.0}, rank
            for name, weight in by_ep[ep]["__weights__"].items():  # the module holds the loaded masters
                torch.testing.assert_close(weight.flatten(), saved[name][0][:weight.numel()], msg=name)
