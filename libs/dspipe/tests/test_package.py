import importlib.metadata
import subprocess
import sys

import dspipe


def test_version_matches_the_installed_metadata():
    assert dspipe.__version__ == importlib.metadata.version("dspipe")


def test_public_api_is_listed():
    for name in dspipe.__all__:
        assert hasattr(dspipe, name), name
    assert issubclass(dspipe.PipelineError, RuntimeError)
    assert issubclass(dspipe.ScheduleError, dspipe.PipelineError)
    assert issubclass(dspipe.ScheduleError, ValueError)
    for name in dspipe.schedules.__all__:
        assert hasattr(dspipe.schedules, name), name


def test_schedules_and_cli_import_without_torch():
    # torch made unimportable: the pure half of dspipe must still load.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import dspipe, dspipe.schedules, dspipe.cli\n"
            "assert 'torch' not in {m for m in sys.modules if sys.modules[m] is not None}\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
