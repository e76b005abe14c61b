"""Loading through WholeCheckpoint: `read_whole` of a dstrain checkpoint applied by `load_whole` at another
data-parallel size, reached the way a foreign format is (a reader in FOREIGN_READERS), continues as the
uninterrupted run; and dsdata's step-hook state (random-LTD) travels in tensor-parallel checkpoints, at
the same and at another tensor degree."""

import warnings
from pathlib import Path

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model
from test_data_efficiency import LTD

import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint import FOREIGN_READERS, ForeignReader, read_whole

SCHEDULER = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 10}}


def _weights(engine):
    return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def saved_at_two_ranks(rank, world, root):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(stage=2, optimizer=ADAMW, scheduler=SCHEDULER))
    data = TokenDataset().data
    for step in range(3):
        engine.backward(engine(data[8 * step + 4 * rank:8 * step + 4 * rank + 4]))
        engine.step()
    engine.save_checkpoint(root, tag="t", client_state={"run": "two ranks"})
    engine.backward(engine(data[24 + 4 * rank:28 + 4 * rank]))  # the uninterrupted next step
    engine.step()
    return _weights(engine), engine.get_lr()


def loaded_whole_at_one_rank(rank, world, root):
    # A "foreign" format that is a marker file beside a dstrain checkpoint, read whole: what DeepSpeed's
    # reader does with its files, through the same registry and load_whole.
    FOREIGN_READERS.append(ForeignReader("test-whole", detect=lambda d: (d / "WHOLE").is_file(),
                                         read=lambda d: read_whole(d.parent / "t")))
    (Path(root) / "via_whole").mkdir(exist_ok=True)
    (Path(root) / "via_whole" / "WHOLE").touch()
    engine, *_ = dstrain.initialize(model=make_model(seed=5),
                                    config=config(gas=2, stage=1, optimizer=ADAMW, scheduler=SCHEDULER))
    path, client = engine.load_checkpoint(root, tag="via_whole")
    engine.save_checkpoint(root, tag="again")  # what was loaded, saved at this layout
    data = TokenDataset().data
    for micro in range(2):  # the same samples as both ranks' next step
        engine.backward(engine(data[24 + 4 * micro:28 + 4 * micro]))
        engine.step()
    return path, client, engine.global_steps, engine.get_lr(), _weights(engine)


def test_read_whole_and_load_whole_at_another_data_parallel_size(tmp_path):
    uninterrupted, uninterrupted_lr = run_ranks(saved_at_two_ranks, 2, str(tmp_path), timeout=120)[0]
    path, client, steps, lr, weights = run_ranks(loaded_whole_at_one_rank, 1, str(tmp_path), timeout=120)[0]
    assert path.endswith("via_whole") and client == {"run": "two ranks"} and steps == 4 and lr == uninterrupted_lr
    for name, weight in uninterrupted.items():  # Adam's moments and step came across: the same next step
        torch.testing.assert_close(weights[name], weight, rtol=1e-5, atol=1e-6, msg=name)
    saved, again = read_whole(tmp_path / "t"), read_whole(tmp_path / "again")
    assert again.lr_scheduler == saved.lr_scheduler and again.param_groups == saved.param_groups
    # micro_steps follows the new gradient_accumulation_steps (2): the next step is a full accumulation
    assert again.progress == {**saved.progress, "micro_steps": 6}
    assert saved.progress["global_steps"] == 3 and saved.scalars["step"] == 3
    for name, kinds in saved.parameters.items():
        assert set(kinds) == {"master", "exp_avg", "exp_avg_sq"} == set(again.parameters[name])
        for kind, value in kinds.items():
            assert torch.equal(again.parameters[name][kind], value), (name, kind)
    assert set(saved.module) == set(make_model().state_dict())


ROUTING = {"enabled": True, "data_routing": {"enabled": True, "random_ltd": LTD}}


def tensor_parallel_hooks(rank, world, root):
    from tp_models import hf_model, tokens, tp_config

    def engine_at(tp):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no layer of the HF model drops tokens: the schedule still steps
            return dstrain.initialize(model=hf_model(seed=tp), config={**tp_config(tp, 1),
                                                                      "data_efficiency": ROUTING})[0]

    engine = engine_at(2)
    for step in range(3):
        ids = tokens(step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
    engine.save_checkpoint(root, tag="t")
    saved = engine.random_ltd_scheduler.state_dict()
    restored = {}
    for tp in (2, 1):  # the same layout, and another (read whole)
        again = engine_at(tp)
        restored["fresh"] = again.random_ltd_scheduler.state_dict()
        again.load_checkpoint(root, tag="t")
        restored[tp] = again.random_ltd_scheduler.state_dict()
    return saved, restored


def test_step_hook_state_travels_in_tensor_parallel_checkpoints(tmp_path):
    pytest.importorskip("transformers")
    for saved, restored in run_ranks(tensor_parallel_hooks, 2, str(tmp_path), timeout=180):
        assert restored["fresh"] != saved, saved  # three steps moved the schedule
        assert restored[2] == saved and restored[1] == saved


def crafted_whole(rank, world, root):
    from dstrain.checkpoint import WholeCheckpoint

    engine, *_ = dstrain.initialize(model=make_model(), config=config(stage=1, optimizer=ADAMW))
    before = _weights(engine)
    module = {name: torch.zeros_like(value) for name, value in make_model().state_dict().items()}
    module["head.bias"] = torch.zeros(3)  # the wrong shape, after every other weight
    wrong_moment = {"master": torch.zeros(48, 24), "exp_avg": torch.zeros(24, 48)}
    messages = []
    for whole in (WholeCheckpoint(module=module, parameters={}, source="crafted"),
                  WholeCheckpoint(module={**module, "head.bias": torch.zeros(48)},
                                  parameters={"head.weight": wrong_moment}, source="crafted")):
        FOREIGN_READERS[:] = [ForeignReader("crafted", detect=lambda d: True, read=lambda d, w=whole: w)]
        Path(root, "x").mkdir(exist_ok=True)
        try:
            engine.load_checkpoint(root, tag="x")
            messages.append("loaded")
        except dstrain.CheckpointLoadError as exc:
            messages.append(str(exc))
    after = _weights(engine)
    return messages, all(torch.equal(before[name], after[name]) for name in before)


def test_a_whole_checkpoint_that_does_not_fit_loads_nothing(tmp_path):
    (bias, moment), untouched = run_ranks(crafted_whole, 1, str(tmp_path), timeout=60)[0]
    assert "head.bias is (3,)" in bias and "(48,)" in bias and "nothing was loaded" in bias, bias
    assert "head.weight: its exp_avg is (24, 48) but its weight (48, 24)" in moment, moment
    assert untouched
