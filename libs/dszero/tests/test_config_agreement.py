"""dsconfig and dszero agree on every ZeRO config users bring: what dsconfig accepts, dszero runs, with the
numbers dsconfig's one "auto" table gives (no fallback of dszero's own), for every config of the corpus
and of the examples."""

import json
import warnings
from pathlib import Path

import attrs
import pytest
import torch
from torch import nn

import dsconfig
import dszero
from dscomm.testing import run_ranks

REPO = Path(__file__).resolve().parents[3]
CONFIGS = sorted((REPO / "libs/dsconfig/tests/corpus").rglob("*.json")) + sorted(
    (REPO / "facade/examples/configs").glob("*.json"))


def _zero_config(path: Path, nvme: str) -> dsconfig.DeepSpeedConfig | None:
    text = path.read_text()
    if '"zero_optimization"' not in text:
        return None
    try:
        raw, _ = dsconfig.read_source(str(path))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = dsconfig.load(raw, world_size=1, strict=False)
    except dsconfig.ConfigError:
        return None  # refused by dsconfig (its own tests list why): nothing for dszero to agree with
    zero = cfg.zero_optimization
    for name in ("offload_param", "offload_optimizer"):  # swap files go to a private directory
        section = getattr(zero, name)
        if section is not None and section.device == "nvme":
            zero = attrs.evolve(zero, **{name: attrs.evolve(section, nvme_path=nvme)})
    return attrs.evolve(cfg, zero_optimization=zero)


def build_each(rank, world, nvme):
    outcomes = {}
    for path in CONFIGS:
        cfg = _zero_config(path, nvme)
        if cfg is None:
            continue
        resolved = dsconfig.resolve_auto(cfg).zero_optimization
        precision = dszero.Precision.from_config(cfg.fp16, cfg.bf16)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).to(precision.torch_dtype)
        try:
            zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), cfg.zero_optimization,
                                        precision=precision)
        except (dszero.ZeroError, dszero.ZeroConfigError) as exc:
            outcomes[path.name] = f"refused: {exc}"
            continue
        outcomes[path.name] = {key: (used, _value(resolved, key)) for key, used in zero.effective_settings().items()
                               if used != _value(resolved, key)}
    return outcomes


def _value(zero, key):
    value = zero
    for part in key.split("."):
        value = getattr(value, part)
    return value


def test_dszero_runs_every_zero_config_dsconfig_accepts_with_the_same_numbers(tmp_path):
    outcomes = run_ranks(build_each, 1, str(tmp_path), timeout=300)[0]
    assert len(outcomes) >= 40  # the corpus is mostly ZeRO configs
    disagreements = {name: outcome for name, outcome in outcomes.items() if outcome}
    assert disagreements == {}, json.dumps(disagreements, indent=1)


@pytest.mark.parametrize("key", ["stage3_prefetch_bucket_size", "reduce_bucket_size", "sub_group_size"])
def test_auto_reaches_dszero_as_dsconfigs_number(key):
    section = dsconfig.ZeroConfig(stage=2, **{key: "auto"})
    expected = getattr(dsconfig.resolve_auto(section), key)
    assert expected == getattr(dsconfig.ZeroConfig(), key)  # the reference default, from the field itself
