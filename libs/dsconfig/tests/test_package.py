"""The package as installed: version, public API, import cost."""

import importlib.metadata
import subprocess
import sys

import dsconfig


def test_version_matches_the_installed_metadata():
    assert dsconfig.__version__ == importlib.metadata.version("dsconfig")


def test_public_api_is_listed():
    for name in dsconfig.__all__:
        assert hasattr(dsconfig, name), name
    assert issubclass(dsconfig.ConfigError, ValueError)
    assert dsconfig.DeepSpeedConfigError is dsconfig.ConfigError


def test_import_pulls_in_neither_torch_nor_numpy():
    code = "import sys, dsconfig; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_section_classes_are_exported_with_their_reference_names():
    cfg = dsconfig.load({})
    assert isinstance(cfg.zero_optimization, dsconfig.ZeroConfig)
    assert isinstance(cfg.data_efficiency.data_routing.random_ltd, dsconfig.RandomLTDConfig)
    assert isinstance(cfg.comms_logger, dsconfig.CommsLoggerConfig)
