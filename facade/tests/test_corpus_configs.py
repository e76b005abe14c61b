"""Every real DeepSpeed config of the corpus (libs/dsconfig/tests/corpus) either trains two steps at world
size 2 or is refused with an error that names its key: none crashes. The outcome of each file is held
to a snapshot (corpus_outcomes.json; `python corpus_run.py` rewrites it after a deliberate change)."""

import json
import re

from corpus_run import CORPUS, OUTCOMES, kind, run_all

from dscomm.testing import run_ranks


def test_every_corpus_config_trains_or_is_refused_by_key(tmp_path):
    names = sorted(p.name for p in CORPUS.glob("*.json"))
    assert len(names) >= 70
    results = run_ranks(run_all, 2, names, str(tmp_path), timeout=600)
    assert results[0].keys() == results[1].keys()
    crashes = {n: r for n, r in results[0].items() if r.startswith("CRASH")}
    assert not crashes
    for name, result in results[0].items():
        if result.startswith("refused"):
            assert re.search(r"- [a-z_][\w.]*( = |: )", result), (name, result)  # the message names a key path
    expected = json.loads(OUTCOMES.read_text())
    assert {n: kind(r) for n, r in results[0].items()} == expected
    assert sum(1 for r in expected.values() if r == "trained") >= 46
