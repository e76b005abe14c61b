"""initialize() builds the run's ParallelDims from the config once, registers its groups for
dscomm.groups' getters, and hands the data group to ZeRO; layouts the plain engine cannot run are
refused by key."""

import pytest
from engine_models import ADAMW, TokenDataset, config, make_model

import dscomm
import dsconfig
import dstrain
from dscomm.testing import run_ranks
from dstrain.wiring.layout import parallel_dims, requested_degrees


def _cfg(**extra):
    return requested_degrees(dsconfig.load({"train_batch_size": 8, **extra}, world_size=1))


def test_the_plain_layout_is_data_parallel_over_the_world():
    dims = parallel_dims(_cfg(), 4)
    assert dims == dscomm.ParallelDims(4) and (dims.pipe, dims.tensor, dims.data) == (1, 1, 4)
    assert parallel_dims(_cfg(pipeline={"stages": "auto"}), 4).data == 4  # auto: the model would decide


def test_a_tensor_parallel_layout_runs_with_data_parallel_beside_it():
    dims = parallel_dims(_cfg(tensor_parallel={"autotp_size": 2}), 4)
    assert (dims.pipe, dims.tensor, dims.data) == (1, 2, 2)


@pytest.mark.parametrize(("extra", "key", "layout"), [
    ({"pipeline": {"stages": 2}}, "pipeline.stages", "pipe 2 x tensor 1 x data 2"),
])
def test_a_layout_the_engine_cannot_run_is_refused_by_key(extra, key, layout):
    with pytest.raises(dstrain.UnsupportedFeatureError) as caught:
        parallel_dims(_cfg(**extra), 4)
    assert key in str(caught.value) and layout in str(caught.value)


def test_an_impossible_layout_names_the_key_and_every_factor():
    with pytest.raises(dstrain.ConfigError) as caught:
        parallel_dims(_cfg(pipeline={"stages": 3}), 4)
    assert "pipeline.stages" in str(caught.value) and "world 4" in str(caught.value) and "pipe 3" in str(caught.value)


def registered_layout(rank, world):
    stale = dscomm.ParallelDims(world, tensor=world).build()  # a layout someone registered before
    dscomm.groups.use(stale)
    engine, *_ = dstrain.initialize(model=make_model(), config=config(stage=1, optimizer=ADAMW))
    groups = dscomm.groups.current()
    data = TokenDataset().data
    engine.backward(engine(data[rank * 4:(rank + 1) * 4]))
    engine.step()
    return (groups is not stale, groups.dims == dscomm.ParallelDims(world),
            dscomm.groups.get_data_parallel_world_size(), engine.optimizer.process_group is groups.data,
            engine.optimizer.norm_group is groups.norm, engine.data_parallel_group is groups.data)


def test_initialize_registers_its_layout_and_zero_reduces_over_its_data_group():
    for result in run_ranks(registered_layout, 2):
        assert result == (True, True, 2, True, True, True)
