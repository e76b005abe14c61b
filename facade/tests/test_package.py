"""The package as installed: version, public API (DeepSpeed's names), lazy import."""

import importlib.metadata
import subprocess
import sys

import dstrain


def test_version_matches_the_installed_metadata():
    assert dstrain.__version__ == importlib.metadata.version("dstrain")


def test_public_api_resolves_and_carries_deepspeeds_names():
    for name in dstrain.__all__:
        assert getattr(dstrain, name) is not None, name
    for name in ("initialize", "add_config_arguments", "init_distributed", "DeepSpeedEngine", "checkpointing",
                 "comm", "zero", "DeepSpeedConfigError", "RepeatingLoader"):
        assert name in dstrain.__all__
    assert dstrain.DeepSpeedConfigError is dstrain.ConfigError
    assert issubclass(dstrain.ConfigError, ValueError) and issubclass(dstrain.DstrainError, RuntimeError)


def test_import_is_lazy_so_the_launcher_starts_without_torch():
    code = "import sys, dstrain, dstrain.launcher; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
