"""The feature gate asks the installed libraries: a "dstrain.features" entry point lifts the gate on
the config feature it names; without one, the key is refused with the `pip install` that provides it."""

from importlib.metadata import EntryPoint

import pytest
from engine_models import ADAMW, config, make_model

import dsconfig
import dstrain
from dscomm.testing import run_ranks
from dstrain.wiring import feature_gate
from dstrain.wiring.feature_gate import FEATURE_GROUP, GATED_FEATURES, check_features, provided_features

EXPERTS_ON = {"train_batch_size": 4, "expert_parallel": {"enabled": True, "autoep_size": 1}}


def _point(name, value, group=FEATURE_GROUP):
    return EntryPoint(name=name, value=value, group=group)


def _refusal(raw, provided, installed=lambda name: False):
    with pytest.raises(dstrain.UnsupportedFeatureError) as caught:
        check_features(dsconfig.load(raw, world_size=1, strict=False), raw, provided, installed)
    return str(caught.value)


def test_declared_entry_points_name_what_is_provided():
    declared = [_point("expert_parallel.enabled", "dsmoe"), _point("pipeline", "dspipe.features"),
                _point("expert_parallel.enabled", "elsewhere", group="console_scripts")]
    assert provided_features(declared) == {"expert_parallel.enabled": "dsmoe", "pipeline": "dspipe.features"}


def test_a_feature_no_library_provides_names_the_key_and_the_pip_install():
    message = _refusal(EXPERTS_ON, provided_features([_point("pipeline", "dspipe")]))
    assert "expert_parallel.enabled" in message and "pip install dsmoe" in message
    # Installed, but a version that does not declare the feature: no pip line that would change nothing.
    message = _refusal(EXPERTS_ON, provided_features([]), installed=lambda name: name == "dsmoe")
    assert "the installed dsmoe does not provide it" in message and "pip install" not in message


def test_a_declared_library_lifts_the_pip_install_gate(monkeypatch):
    provided = provided_features([_point("expert_parallel.enabled", "dsmoe")])
    monkeypatch.setattr(feature_gate, "ENGINE_COMPOSES", frozenset())  # an engine that does not compose it yet
    message = _refusal(EXPERTS_ON, provided)  # installed, but this engine does not compose it
    assert "pip install" not in message and "dsmoe provides it" in message and "expert_parallel.enabled" in message
    monkeypatch.setattr(feature_gate, "ENGINE_COMPOSES", frozenset({"expert_parallel.enabled"}))
    check_features(dsconfig.load(EXPERTS_ON, world_size=1), EXPERTS_ON, provided)  # nothing left to refuse


def test_features_dstrain_never_provides_stay_refused_whatever_is_declared():
    raw = {"train_batch_size": 4, "sparse_attention": {"mode": "fixed"}}
    declared = provided_features([_point("sparse_attention", "y")])
    with pytest.warns(dsconfig.ConfigWarning):
        message = _refusal(raw, declared)
    assert "sparse_attention" in message


def test_every_gated_feature_is_off_by_default_and_on_by_its_key():
    off = dsconfig.load({"train_batch_size": 4}, world_size=1)
    assert not any(feature.is_on(off) for feature in GATED_FEATURES)
    on = {"pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2,
          "expert_parallel": {"enabled": True, "autoep_size": 1}, "data_efficiency": {"enabled": True},
          "curriculum_learning": {"enabled": True, "min_difficulty": 8, "max_difficulty": 64,
                                  "schedule_type": "fixed_discrete",
                                  "schedule_config": {"difficulty": [8, 64], "max_step": [10]}}}
    for feature in GATED_FEATURES:
        section = feature.key.split(".")[0]
        assert feature.is_on(dsconfig.load({"train_batch_size": 4, section: on[section]}, world_size=1)), feature


def test_the_installed_distributions_are_asked(tmp_path, monkeypatch):
    # A distribution's metadata on sys.path, as pip leaves it, declaring one feature.
    info = tmp_path / "dsfake-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsfake\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{FEATURE_GROUP}]\ndsfake.feature = dsfake.curriculum\n")
    assert "dsfake.feature" not in provided_features()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert provided_features()["dsfake.feature"] == "dsfake.curriculum"


def _refused(rank, world, **extra):
    try:
        dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW, **extra))
    except dstrain.UnsupportedFeatureError as exc:
        return str(exc)
    return ""


UNPROVIDED_CASES = [(extra, key, library) for extra, key, library in [
    ({"tensor_parallel": {"autotp_size": 2}}, "tensor_parallel.autotp_size", "dstp"),
    ({"pipeline": {"stages": 2}}, "pipeline.stages", "dspipe"),
    ({"expert_parallel": {"enabled": True, "autoep_size": 1}}, "expert_parallel.enabled", "dsmoe"),
    ({"data_efficiency": {"enabled": True}}, "data_efficiency.enabled", "dsdata"),
    ({"sequence_parallel_size": 2}, "sequence_parallel_size", "dsseq"),
] if next(f for f in GATED_FEATURES if f.key == key).name not in provided_features()]


@pytest.mark.skipif(not UNPROVIDED_CASES, reason="every gated feature has an installed provider here")
def test_initialize_refuses_an_unprovided_feature_by_key_and_pip_install():
    # End to end, for whichever gated features no installed library provides in this environment.
    for extra, key, library in UNPROVIDED_CASES:
        message = run_ranks(_refused, 1, **extra)[0]
        assert key in message and library in message, message
