import importlib.metadata

import dstp


def test_version_matches_the_installed_metadata():
    assert dstp.__version__ == importlib.metadata.version("dstp")


def test_public_api_is_listed_and_the_error_is_a_value_error():
    for name in dstp.__all__:
        assert hasattr(dstp, name), name
    assert issubclass(dstp.TensorParallelError, ValueError)


def test_the_feature_entry_point_names_autotp():
    points = importlib.metadata.entry_points(group="dstrain.features")
    assert any(p.name == "tensor_parallel.autotp_size" and p.value == "dstp" for p in points)
