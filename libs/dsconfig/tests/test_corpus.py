"""The 72 real configs of the corpus: each gives its expected outcome, with stable warnings."""

import json
import warnings

import pytest
from corpus_cases import CORPUS, EXPECTATIONS, NONSTRICT, NONSTRICT_LOADS, REFUSED, corpus_files, observe

import dsconfig

SNAPSHOT = json.loads(EXPECTATIONS.read_text())


def test_corpus_is_complete():
    assert len(corpus_files()) == 72 and len(NONSTRICT) == 8
    assert set(SNAPSHOT) == set(corpus_files())


@pytest.mark.parametrize("name", corpus_files(), ids=lambda n: n[:60])
def test_corpus_file(name):
    seen = observe(name)
    if name in REFUSED:
        paths, _reason = REFUSED[name]
        assert seen["outcome"] == "refused" and seen["error_paths"] == paths
    else:
        assert seen["outcome"] == "loads", seen
    assert seen == SNAPSHOT[name], "warnings changed; rerun corpus_cases.py if deliberate"


@pytest.mark.parametrize("name", NONSTRICT, ids=lambda n: n[:60])
def test_files_that_are_not_json_are_read_as_deepspeed_reads_them(name):
    """DeepSpeed reads configs with hjson: these files (comments, trailing commas, unfilled placeholders, a
    repeated key) read here too, and each then loads or is refused naming its keys, never as unreadable."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dsconfig.ConfigWarning)
        try:
            dsconfig.load(CORPUS / "nonstrict" / name, strict=False)
            refused = None
        except dsconfig.ConfigError as exc:
            refused = exc
    if name in NONSTRICT_LOADS:
        assert refused is None, refused
    else:
        assert refused is not None and refused.paths and "" not in refused.paths and name in str(refused)
        assert "not valid JSON" not in str(refused)


def test_all_loading_files_round_trip():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dsconfig.ConfigWarning)
        for name in corpus_files():
            if name in REFUSED:
                continue
            world = SNAPSHOT[name]["world_size"]
            cfg = dsconfig.load(CORPUS / name, world_size=world, strict=False)
            assert dsconfig.load(cfg.to_dict(), world_size=world, strict=False) == cfg, name
