from importlib.metadata import entry_points, version

import dsdata


def test_version_matches_the_installed_metadata():
    assert dsdata.__version__ == version("dsdata")


def test_public_names_exist_and_the_feature_gate_entry_points_are_declared():
    assert all(hasattr(dsdata, name) for name in dsdata.__all__)
    declared = {point.name: point.value for point in entry_points(group="dstrain.features") if point.value == "dsdata"}
    assert declared == {"data_efficiency.enabled": "dsdata", "curriculum_learning.enabled": "dsdata"}
