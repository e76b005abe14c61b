"""The one table of "auto" tuning knobs: each resolvable key becomes a number (Hugging Face's rule from the
hidden size, else the reference default); keys that carry the user's intent stay "auto"."""

import pytest

import dsconfig
from dsconfig.sections import ZeroConfig

HF_RULES = {"reduce_bucket_size": 64 * 64, "stage3_prefetch_bucket_size": int(0.9 * 64 * 64),
            "stage3_param_persistence_threshold": 640}
DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 500_000_000,
            "stage3_param_persistence_threshold": 100_000, "allgather_bucket_size": 500_000_000,
            "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000,
            "sub_group_size": 1_000_000_000}


def _all_auto() -> dict:
    return {"train_batch_size": 8, "gradient_clipping": "auto", "fp16": {"enabled": "auto"},
            "zero_optimization": {"stage": 3, **{key: "auto" for key in DEFAULTS},
                                  "offload_param": {"device": "cpu", "buffer_size": "auto"}}}


def test_every_resolvable_key_is_in_the_table_and_typed_auto():
    cfg = dsconfig.load(_all_auto())
    assert set(dsconfig.AUTO_RESOLVABLE) <= set(cfg.unresolved_auto())


def test_without_a_model_the_reference_defaults_apply():
    resolved = dsconfig.resolve_auto(dsconfig.load(_all_auto()))
    zero = resolved.zero_optimization
    assert {key: getattr(zero, key) for key in DEFAULTS} == DEFAULTS
    assert zero.offload_param.buffer_size == 100_000_000 and resolved.gradient_clipping == 1.0
    assert resolved.unresolved_auto() == ["fp16.enabled"]  # intent, not a tuning knob: left for the caller


def test_with_a_hidden_size_the_hugging_face_rules_apply():
    zero = dsconfig.resolve_auto(dsconfig.load(_all_auto()), hidden_size=64).zero_optimization
    assert {key: getattr(zero, key) for key in HF_RULES} == HF_RULES
    assert zero.allgather_bucket_size == 500_000_000


@pytest.mark.parametrize("section", [ZeroConfig(stage=2, reduce_bucket_size="auto"), ZeroConfig(stage=2)])
def test_a_section_alone_resolves_the_same_way(section):
    assert dsconfig.resolve_auto(section).reduce_bucket_size == (500_000_000 if section.reduce_bucket_size == "auto"
                                                                 else section.reduce_bucket_size)
    assert dsconfig.resolve_auto(ZeroConfig()) == ZeroConfig()
