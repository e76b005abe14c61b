"""The 72 real configs of the corpus: each gives its expected outcome, with stable warnings."""

import json
import warnings

import pytest
from corpus_cases import CORPUS, EXPECTATIONS, NONSTRICT, REFUSED, corpus_files, observe

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
def test_not_json_files_are_refused_with_a_reason(name):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(CORPUS / "nonstrict" / name, strict=False)
    message = str(info.value)
    assert "not valid JSON" in message and name in message
    assert any(hint in message for hint in ("comments", "placeholder", "fragment", "trailing comma"))


def test_all_loading_files_round_trip():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dsconfig.ConfigWarning)
        for name in corpus_files():
            if name in REFUSED:
                continue
            world = SNAPSHOT[name]["world_size"]
            cfg = dsconfig.load(CORPUS / name, world_size=world, strict=False)
            assert dsconfig.load(cfg.to_dict(), world_size=world, strict=False) == cfg, name
