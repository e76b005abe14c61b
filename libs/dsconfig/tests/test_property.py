"""Random mutations of valid configs either load or raise ConfigError, never another exception."""

import copy
import json
import os
import warnings

from corpus_cases import CORPUS, REFUSED, corpus_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsconfig

VALID = [json.loads((CORPUS / name).read_text()) for name in corpus_files() if name not in REFUSED]
VALID.append(dsconfig.DeepSpeedConfig().to_dict())

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=True),
                         st.text(max_size=8), st.sampled_from(["auto", "cpu", "nvme", "fp16", "Warn", "1e9"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)


def paths_of(data, prefix=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from paths_of(value, (*prefix, key))


@st.composite
def mutated_configs(draw):
    config = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        paths = list(paths_of(config))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        kind = draw(st.sampled_from(["wrong_type", "delete", "rename", "number", "nest"]))
        if kind == "delete":
            del parent[path[-1]]
        elif kind == "rename":
            parent[path[-1] + draw(st.sampled_from(["s", "_", " ", "X"]))] = parent.pop(path[-1])
        elif kind == "number":
            parent[path[-1]] = draw(st.one_of(st.integers(-10**12, 10**12), st.floats(-1e12, 1e12)))
        elif kind == "nest":
            parent[path[-1]] = {draw(st.text(max_size=5)): parent[path[-1]]}
        else:
            parent[path[-1]] = draw(JSON_VALUES)
    return config


@settings(max_examples=int(os.environ.get("DSCONFIG_PROPERTY_EXAMPLES", "400")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=mutated_configs(), world_size=st.sampled_from([1, 2, 3, 8]), strict=st.booleans())
def test_mutations_load_or_raise_config_error(config, world_size, strict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dsconfig.ConfigWarning)
        try:
            cfg = dsconfig.load(config, world_size=world_size, strict=strict)
        except dsconfig.ConfigError as exc:
            assert exc.problems and all(isinstance(p.path, str) for p in exc.problems)
            return
        again = dsconfig.load(cfg.to_dict(), world_size=world_size, strict=False)
    assert again == cfg
