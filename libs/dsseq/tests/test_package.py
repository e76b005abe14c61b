import importlib.metadata
import subprocess
import sys

import dsseq


def test_version_matches_the_installed_metadata():
    assert dsseq.__version__ == importlib.metadata.version("dsseq")


def test_public_api_is_listed_and_the_error_is_a_value_error():
    for name in dsseq.__all__:
        assert hasattr(dsseq, name), name
    assert issubclass(dsseq.SequenceParallelError, ValueError)


def test_the_feature_entry_point_names_sequence_parallel_size():
    points = importlib.metadata.entry_points(group="dstrain.features")
    assert any(p.name == "sequence_parallel_size" and p.value == "dsseq" for p in points)


def test_importing_dsseq_loads_no_transformers():
    # transformers is the hf extra: imported only by register_with_transformers.
    code = "import sys, dsseq; print('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
