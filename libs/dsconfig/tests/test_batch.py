"""train_batch_size = micro batch * accumulation steps * data-parallel size, at world sizes 1, 2 and 8."""

import itertools

import pytest

import dsconfig

TB, MB, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"
MICRO, ACCUM = 4, 2
COMBINATIONS = [combo for r in range(4) for combo in itertools.combinations((TB, MB, GAS), r)]


def consistent(world):
    return {TB: MICRO * ACCUM * world, MB: MICRO, GAS: ACCUM}


@pytest.mark.parametrize("world", [1, 2, 8])
@pytest.mark.parametrize("given", COMBINATIONS, ids=lambda g: "+".join(k.split("_")[1] for k in g) or "none")
def test_each_combination_of_given_keys(world, given):
    config = {key: consistent(world)[key] for key in given}
    cfg = dsconfig.load(config, world_size=world)
    triple = (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)
    if len(given) >= 2:
        assert triple == (MICRO * ACCUM * world, MICRO, ACCUM)
    elif given == (TB,):
        assert triple == (MICRO * ACCUM * world, MICRO * ACCUM, 1)  # accumulation defaults to 1
    elif given == (MB,):
        assert triple == (MICRO * world, MICRO, 1)
    else:  # nothing, or only the accumulation steps: left for a launcher
        assert not cfg.is_batch_resolved()
        assert {TB, MB} <= set(cfg.unresolved_auto())
    if cfg.is_batch_resolved():
        assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * world


@pytest.mark.parametrize("world", [1, 2, 8])
def test_inconsistent_triple_prints_every_factor(world):
    config = {TB: 1000, MB: 3, GAS: 7}
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load(config, world_size=world)
    message = str(info.value)
    assert info.value.paths == [TB]
    for factor in ("1000", "(3)", "(7)", f"data-parallel size {world}", str(3 * 7 * world)):
        assert factor in message


def test_indivisible_triple_names_the_nearest_valid_values():
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({TB: 30, MB: 4}, world_size=2)
    assert info.value.paths == [TB]
    assert "24 or 32" in str(info.value) and "data-parallel size 2" in str(info.value)


def test_auto_is_resolved_when_the_others_determine_it():
    cfg = dsconfig.load({TB: 64, MB: 4, GAS: "auto"}, world_size=8)
    assert cfg.gradient_accumulation_steps == 2 and cfg.unresolved_auto() == []


def test_explicit_auto_gets_no_default():
    cfg = dsconfig.load({MB: 4, GAS: "auto", TB: "auto"}, world_size=2)
    assert cfg.unresolved_auto() == [GAS, TB]
    assert cfg.with_batch_size(gradient_accumulation_steps=3).train_batch_size == 24


@pytest.mark.parametrize("world", [1, 2, 8])
def test_with_batch_size_completes_an_hf_style_config(world):
    cfg = dsconfig.load({TB: "auto", MB: "auto", GAS: "auto"}, world_size=world)
    done = cfg.with_batch_size(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=4)
    assert (done.train_batch_size, done.unresolved_auto()) == (8 * world, [])
    assert cfg.with_batch_size(train_batch_size=16 * world, train_micro_batch_size_per_gpu=4).gradient_accumulation_steps == 4
    assert cfg.with_batch_size(train_micro_batch_size_per_gpu=2).gradient_accumulation_steps == 1


def test_with_batch_size_refuses_an_undetermined_triple_naming_the_keys():
    cfg = dsconfig.load({GAS: 2})
    with pytest.raises(dsconfig.ConfigError) as info:
        cfg.with_batch_size()
    assert info.value.paths == [TB, MB]


def test_with_batch_size_checks_consistency():
    cfg = dsconfig.load({MB: 2, GAS: 2}, world_size=2)
    with pytest.raises(dsconfig.ConfigError):
        cfg.with_batch_size(train_batch_size=10)


@pytest.mark.parametrize("bad", [0, -4, 2.5, "8", True, [8]])
def test_batch_values_must_be_positive_integers(bad):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({MB: bad})
    assert info.value.paths == [MB]


def test_integral_floats_are_integers():
    cfg = dsconfig.load({TB: 32.0, MB: 4e0}, world_size=2)
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps) == (32, 4)
    assert type(cfg.train_batch_size) is int


@pytest.mark.parametrize("world", [0, -1, 1.5, True])
def test_world_size_must_be_a_positive_integer(world):
    with pytest.raises(dsconfig.ConfigError) as info:
        dsconfig.load({}, world_size=world)
    assert info.value.paths == ["world_size"]
