import importlib.metadata

import dscomm


def test_version_matches_the_installed_metadata():
    assert dscomm.__version__ == importlib.metadata.version("dscomm")


def test_public_api_is_listed():
    for name in dscomm.__all__:
        assert hasattr(dscomm, name), name
    assert issubclass(dscomm.CommError, RuntimeError)
