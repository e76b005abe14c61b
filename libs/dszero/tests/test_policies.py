"""A stage is a choice of policies made in one place (dszero.policies.for_stage); the optimizer, the
fragments, the checkpoints and ZeRO++ ask the policies, never the stage number."""

import ast
from pathlib import Path

import pytest

import dszero
from dszero import policies
from dszero.policies import norm, partition, publish, reduction, save

SRC = Path(dszero.__file__).parent


@pytest.mark.parametrize(("stage", "kinds", "flags"), [
    (0, (partition.FlatGroups, reduction.ReduceAtStep, publish.KeepWhole, norm.ReplicatedNorm, save.SaveWhole),
     (False, False, True)),
    (1, (partition.FlatGroups, reduction.ReduceAtStep, publish.GatherShards, norm.ShardedNorm, save.SaveShards),
     (False, True, False)),
    (2, (partition.FlatGroups, reduction.ReduceInBuckets, publish.GatherShards, norm.ShardedNorm, save.SaveShards),
     (False, True, False)),
    (3, (partition.PartitionedUnits, reduction.ReduceEachUnit, publish.RefreshUnits, norm.ShardedNorm,
         save.SaveShards), (True, True, False)),
])
def test_each_stage_is_a_row_of_policies(stage, kinds, flags):
    chosen = policies.for_stage(stage)
    assert chosen.stage == stage
    parts = (chosen.partition, chosen.reduction, chosen.publish, chosen.norm, chosen.save)
    assert tuple(type(p) for p in parts) == kinds
    p = chosen.partition
    assert (p.partitions_parameters, p.shards_optimizer_state, p.whole_tensors) == flags
    assert chosen.save.saved_world(4) == (1 if stage == 0 else 4)
    assert policies.for_stage(stage).partition is not p  # fresh objects: a partition keeps what it built
    if stage == 1:
        assert chosen.reduction.scatter and not policies.for_stage(0).reduction.scatter


def test_an_unknown_stage_is_refused_by_key():
    with pytest.raises(dszero.ZeroConfigError, match=r"zero_optimization.stage = 4; valid: 0, 1, 2, 3"):
        policies.for_stage(4)


def test_a_saved_state_loads_only_into_its_stage_and_world():
    chosen = policies.for_stage(2)
    chosen.save.check_state({"zero_stage": 2, "world_size": 4}, 2, 4)
    with pytest.raises(dszero.ZeroError, match="state_dict is for stage 1 at world size 4; this optimizer is stage 2"):
        chosen.save.check_state({"zero_stage": 1, "world_size": 4}, 2, 4)
    policies.for_stage(0).save.check_state({"zero_stage": 0, "world_size": 1}, 0, 8)  # replicated: saved at 1


def stage_comparisons(path: Path) -> list[str]:
    """Comparisons with an operand named `stage` (zero.stage, self.stage, cfg.stage, stage)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [o.attr if isinstance(o, ast.Attribute) else getattr(o, "id", None) for o in operands]
            if "stage" in names:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_policy_table_branches_on_the_stage():
    everywhere = [hit for path in sorted(SRC.rglob("*.py")) for hit in stage_comparisons(path)]
    # Besides the table, one check compares a saved state's stage with this optimizer's (no branch on it).
    checks = [hit for hit in everywhere if hit.startswith("policies/save.py:") and "'zero_stage'" in hit]
    table = [hit for hit in everywhere if hit.startswith("policies/__init__.py:")]
    assert len(checks) == 1 and len(table) == 4, everywhere
    assert sorted(table + checks) == sorted(everywhere), everywhere
