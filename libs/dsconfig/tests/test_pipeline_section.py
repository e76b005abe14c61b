"""The pipeline section: the schedule key dspipe reads, its default and its values."""

import pytest

import dsconfig


def load(pipeline: dict) -> dsconfig.DeepSpeedConfig:
    return dsconfig.load({"train_batch_size": 8, "pipeline": pipeline}, world_size=1)


def test_the_schedule_defaults_to_1f1b_and_takes_every_training_schedule():
    assert load({}).pipeline.schedule == "1f1b"
    for name in ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"):
        assert load({"schedule": name}).pipeline.schedule == name


@pytest.mark.parametrize("value", ["zbh2", "inference", 3])
def test_another_schedule_is_refused_naming_the_key_and_the_valid_names(value):
    with pytest.raises(dsconfig.ConfigError, match=r"pipeline\.schedule = .*must be one of 'gpipe', '1f1b', "
                                                   r"'interleaved_1f1b', 'zb_h1', 'zbv', 'dualpipev'"):
        load({"schedule": value})


def test_the_other_keys_keep_deepspeeds_defaults():
    section = load({}).pipeline
    assert (section.stages, section.partition, section.seed_layers, section.activation_checkpoint_interval) == \
        ("auto", "best", False, 0)
    assert load({"stages": 4, "partition": "type:transformer"}).pipeline.stages == 4
