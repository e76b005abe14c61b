"""requested_unsupported: the unsupported keys whose value turns a feature on, by path."""

import dsconfig


def test_turned_on_features_are_listed_by_path():
    raw = {"sparse_attention": {"mode": "fixed"}, "progressive_layer_drop": {"enabled": True},
           "zero_optimization": {"stage": 3, "mics_shard_size": 8}, "memory_breakdown": True}
    paths = sorted(p.path for p in dsconfig.requested_unsupported(raw))
    assert paths == ["memory_breakdown", "progressive_layer_drop", "sparse_attention",
                     "zero_optimization.mics_shard_size"]


def test_turned_off_or_empty_values_are_not_requests():
    raw = {"progressive_layer_drop": {"enabled": False}, "memory_breakdown": False, "sparse_gradients": None,
           "elasticity": {}, "zero_optimization": {"mics_shard_size": 0}}
    assert dsconfig.requested_unsupported(raw) == []


def test_keys_whose_effect_needs_no_missing_feature_are_not_requests():
    raw = {"zero_optimization": {"elastic_checkpoint": True}, "compile": {"disable": False, "backend": "inductor"},
           "fp16": {"enabled": True, "opt_level": "O2"}}
    assert [p.path for p in dsconfig.requested_unsupported(raw)] == ["fp16.opt_level"]
