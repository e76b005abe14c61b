import importlib.metadata

import dsaio


def test_version_matches_installed_metadata():
    assert dsaio.__version__ == importlib.metadata.version("dsaio")


def test_public_api_is_all_of_init():
    for name in dsaio.__all__:
        assert hasattr(dsaio, name), name
