"""DeepSpeed's universal checkpoint layout, both ways: `"checkpoint": {"load_universal": true}` loads what
DeepSpeed's ds_to_universal wrote at another data-parallel, tensor-parallel or pipeline size, and
`python -m dstrain.checkpoint.ds_to_universal` converts a dstrain or DeepSpeed checkpoint into it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import interop_models as im
import pytest
import torch

import dstrain
from dscomm.testing import run_ranks
from dstrain.checkpoint import ds_to_universal
from dstrain.checkpoint.deepspeed.unpickler import load_pickle
from dstrain.errors import CheckpointLoadError

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed"
UNIVERSAL = FIXTURES / "universal"
TP_RULES = {"use_default_specs": False, "layer_specs": [
    {"patterns": [r".*\.up\.weight$", r".*\.up\.bias$"], "partition_type": "column"},
    {"patterns": [r".*\.down\.weight$"], "partition_type": "row"}]}


def deepspeed_losses(case: str) -> list[float]:
    return json.loads((FIXTURES / case / "expected.json").read_text())["losses_after_save"]


def run_config(stage: int, dp: int, tp: int = 1, universal: bool = True) -> dict:
    cfg = im.config(stage, dp_size=dp)
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    if tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": tp, "partition_config": TP_RULES}
    return cfg


def train(engine, dp_rank: int, dp: int, first: int, count: int) -> list[float]:
    losses = []
    accumulation = engine.gradient_accumulation_steps()
    world = torch.distributed.get_world_size()
    for step in range(first, first + count):
        total = 0.0
        for batch in im.micro_batches(step, dp_rank, dp, accumulation):
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        mean = torch.tensor(total / accumulation)
        torch.distributed.all_reduce(mean)  # every rank of a data-parallel replica reports its replica's loss
        losses.append(mean.item() / world)
    return losses


def load_and_train(rank, world, directory, stage, tp):
    dp = world // tp
    engine, *_ = dstrain.initialize(model=im.make_lm(seed=99), config=run_config(stage, dp, tp))
    path, client = engine.load_checkpoint(directory)
    head = (path, client, engine.global_steps)
    return head, train(engine, rank // tp, dp, im.STEPS_BEFORE_SAVE, im.STEPS_AFTER_SAVE)


@pytest.mark.parametrize(("world", "stage", "tp"), [(2, 2, 1), (1, 3, 1), (2, 0, 2)])
def test_deepspeeds_universal_folder_loads_at_another_layout(world, stage, tp):
    (path, client, steps), losses = run_ranks(load_and_train, world, str(UNIVERSAL), stage, tp, timeout=180)[0]
    assert Path(path) == UNIVERSAL / (UNIVERSAL / "latest_universal").read_text().strip()
    assert client == im.CLIENT_STATE and steps == im.STEPS_BEFORE_SAVE
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(deepspeed_losses("universal")), rtol=1e-5, atol=0)


def save_and_continue(rank, world, directory, tp):
    dp = world // tp
    engine, *_ = dstrain.initialize(model=im.make_lm(), config=run_config(1, dp, tp, universal=False))
    train(engine, rank // tp, dp, 0, im.STEPS_BEFORE_SAVE)
    engine.save_checkpoint(directory, client_state={"note": "dstrain"})
    return train(engine, rank // tp, dp, im.STEPS_BEFORE_SAVE, im.STEPS_AFTER_SAVE)


@pytest.mark.parametrize("tp", [1, 2])
def test_dstrain_to_universal_to_dstrain_at_another_size_equals_an_uninterrupted_run(tmp_path, tp):
    """Saved at 2 data-parallel ranks (or 2 tensor ranks), converted, loaded at 1 rank at ZeRO-3."""
    uninterrupted = run_ranks(save_and_continue, 2, str(tmp_path / "ckpt"), tp, timeout=180)[0]
    out = tmp_path / "ckpt" / "global_step3_universal"
    assert ds_to_universal.main(["--input_folder", str(tmp_path / "ckpt" / "global_step3"), "--output_folder",
                                 str(out)]) == 0
    assert (tmp_path / "ckpt" / "latest_universal").read_text() == out.name
    from dstrain.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    masters = get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt")  # dstrain's own: <tag>/zero under latest
    for name, value in masters.items():
        assert torch.equal(value, load_pickle(out / "zero" / name / "fp32.pt")["param"])
    (path, client, steps), losses = run_ranks(load_and_train, 1, str(tmp_path / "ckpt"), 3, 1, timeout=180)[0]
    assert Path(path) == out and client == {"note": "dstrain"} and steps == im.STEPS_BEFORE_SAVE
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(uninterrupted), rtol=1e-5, atol=0)


@pytest.mark.parametrize("case", ["zero2_fp32", "zero3_fp32", "zero1_bf16"])
def test_our_conversion_of_a_deepspeed_checkpoint_holds_what_deepspeeds_does(tmp_path, case):
    out = tmp_path / "global_step3_universal"
    assert ds_to_universal.main(["--input_folder", str(FIXTURES / case / "global_step3"),
                                 "--output_folder", str(out)]) == 0
    theirs = UNIVERSAL / "global_step3_universal" / "zero"
    names = sorted(p.name for p in theirs.iterdir() if p.is_dir())
    assert names == sorted(p.name for p in (out / "zero").iterdir() if p.is_dir())
    tolerance = {"rtol": 0, "atol": 0} if "fp32" in case else {"rtol": 0.05, "atol": 1e-3}  # bf16: another run
    for name in names:
        for stem in ("fp32", "exp_avg", "exp_avg_sq"):
            ours, reference = load_pickle(out / "zero" / name / f"{stem}.pt"), load_pickle(theirs / name / f"{stem}.pt")
            torch.testing.assert_close(ours["param"], reference["param"], **tolerance)
            # Each file holds its own tensor, not the flat buffer it was read from.
            ours_size = (out / "zero" / name / f"{stem}.pt").stat().st_size
            assert ours_size <= (theirs / name / f"{stem}.pt").stat().st_size + 4096
        assert float(load_pickle(out / "zero" / name / "step.pt")) == 3.0
    model_states = load_pickle(out / "mp_rank_00_model_states.pt")
    assert model_states["global_steps"] == 3 and model_states["lr_scheduler"] == {"last_batch_iteration": 2}
    assert {k: model_states[k] for k in im.CLIENT_STATE} == im.CLIENT_STATE


def pipeline_from_universal(rank, world, directory):
    from dstrain.pipe import PipelineModule

    module = PipelineModule(im.pipeline_layers(), num_stages=1, loss_fn=im.lm_loss)
    cfg = im.config(2, dp_size=world, pipeline=True)
    cfg["checkpoint"] = {"load_universal": True}
    engine, *_ = dstrain.initialize(model=module, config=cfg)
    engine.load_checkpoint(directory)
    losses = []
    for step in range(im.STEPS_BEFORE_SAVE, im.STEPS_BEFORE_SAVE + im.STEPS_AFTER_SAVE):
        micro = im.micro_batches(step, rank, world, engine.gradient_accumulation_steps())
        loss = torch.tensor(float(engine.train_batch(iter([(b[:, :-1], b[:, 1:]) for b in micro]))))
        torch.distributed.all_reduce(loss)
        losses.append(loss.item() / world)
    return losses


def test_a_deepspeed_pipeline_converted_to_universal_loads_into_another_pipeline(tmp_path):
    out = tmp_path / "global_step3_universal"
    assert ds_to_universal.main(["--input_folder", str(FIXTURES / "pipe2_zero1_fp32"), "--output_folder",
                                 str(out)]) == 0  # the checkpoint root: its `latest` names the tag
    losses = run_ranks(pipeline_from_universal, 2, str(tmp_path), timeout=180)[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(deepspeed_losses("pipe2_zero1_fp32")), rtol=1e-5,
                               atol=0)


def refused(rank, world, directory):
    engine, *_ = dstrain.initialize(model=im.make_lm(seed=99), config=run_config(2, world))
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    with pytest.raises(CheckpointLoadError) as info:
        engine.load_checkpoint(directory)
    untouched = all(torch.equal(before[k], v) for k, v in engine.module.state_dict().items())
    return str(info.value), untouched and engine.global_steps == 0


def broken_copy(tmp_path: Path, name: str) -> tuple[Path, Path]:
    root = tmp_path / name
    shutil.copytree(UNIVERSAL, root)
    return root, root / "global_step3_universal" / "zero"


def refused_each(rank, world, directories):
    return [refused(rank, world, directory) for directory in directories]


def test_a_missing_parameter_another_shape_or_a_truncated_file_is_named_and_loads_nothing(tmp_path):
    missing_root, zero = broken_copy(tmp_path, "missing")
    shutil.rmtree(zero / "blocks.1.up.weight")
    missing = zero / "blocks.1.up.weight" / "fp32.pt"
    shape_root, zero = broken_copy(tmp_path, "shape")
    torch.save({"param": torch.zeros(7, 7)}, zero / "head.weight" / "fp32.pt")
    truncated_root, zero = broken_copy(tmp_path, "truncated")
    victim = zero / "embed.weight" / "exp_avg.pt"
    victim.write_bytes(victim.read_bytes()[:200])
    roots = [str(missing_root), str(shape_root), str(truncated_root)]
    (missing_message, *_), (shape_message, *_), (truncated_message, *_) = results = \
        run_ranks(refused_each, 1, roots, timeout=180)[0]
    assert all(untouched for _, untouched in results)
    assert str(missing) in missing_message
    assert "head.weight" in shape_message and "(7, 7)" in shape_message
    assert str(victim) in truncated_message


def test_the_command_line_refuses_bad_folders_and_writes_nothing(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    source = str(FIXTURES / "zero2_fp32" / "global_step3")
    assert ds_to_universal.main(["--input_folder", source, "--output_folder", str(taken)]) == 1
    assert "already exists" in capsys.readouterr().err and (taken / "keep.txt").read_text() == "mine"
    assert ds_to_universal.main(["--input_folder", str(tmp_path), "--output_folder", str(tmp_path / "out")]) == 1
    assert "neither a dstrain checkpoint" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_command_converts_and_is_reachable_under_deepspeeds_name(tmp_path):
    """`python -m dstrain.checkpoint.ds_to_universal` as a user runs it (a fresh process), and the same module
    as `deepspeed.checkpoint.ds_to_universal` under the import alias, with DeepSpeed's arguments."""
    out = tmp_path / "universal"
    snippet = ("import dstrain.as_deepspeed\nfrom deepspeed.checkpoint import ds_to_universal\n"
               "import dstrain.checkpoint.ds_to_universal as ours\nassert ds_to_universal is ours\n"
               "args = ds_to_universal.parse_arguments(['--input_folder', 'a', '--output_folder', 'b', '--no_strict',"
               " '--keep_temp_folder', '--inject_missing_state', '--num_extract_workers', '2', "
               "'--num_merge_workers', '1'])\nassert not args.strict and args.num_extract_workers == 2\n"
               "import runpy, sys\nsys.argv = ['ds_to_universal'] + sys.argv[1:]\n"
               "runpy.run_module('dstrain.checkpoint.ds_to_universal', run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-c", snippet, "--input_folder", str(FIXTURES / "zero2_fp32"),
                          "--output_folder", str(out)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert "wrote" in run.stdout and (tmp_path / "latest_universal").read_text() == out.name
    names = {p.name for p in (UNIVERSAL / "global_step3_universal" / "zero").iterdir() if p.is_dir()}
    assert {p.name for p in (out / "zero").iterdir() if p.is_dir()} == names


def save_with_universal_info(rank, world, directory):
    engine, *_ = dstrain.initialize(model=im.make_lm(), config=run_config(1, world, universal=False))
    train(engine, rank, world, 0, 1)
    # DeepSpeed's converter requires the client to put a universal_checkpoint_info in the client state (its own
    # unit test puts an empty one, Megatron-DeepSpeed its merge patterns).
    engine.save_checkpoint(directory, tag="tagged", client_state={
        "universal_checkpoint_info": {"original_vocab_size": 7}, "note": "mine"})
    return engine.global_steps


def test_a_client_universal_info_and_deepspeeds_namespace_arguments_convert(tmp_path):
    """DeepSpeed's unit test (checkpoint/test_universal_checkpoint.py) calls `ds_to_universal.main` with a
    `types.SimpleNamespace` of its arguments after saving `client_state={'universal_checkpoint_info': {}, ...}`:
    both convert, the client's info is kept beside the layout's version, and the result loads at another size."""
    import types

    steps = run_ranks(save_with_universal_info, 2, str(tmp_path), timeout=180)[0]
    out = tmp_path / "tagged_universal"
    args = types.SimpleNamespace(input_folder=str(tmp_path / "tagged"), output_folder=str(out), num_extract_workers=1,
                                 num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=False)
    assert ds_to_universal.main(args) == 0
    states = load_pickle(out / "mp_rank_00_model_states.pt")
    assert states["universal_checkpoint_info"] == {"original_vocab_size": 7, "universal_checkpoint_version": 0.4}
    assert states["note"] == "mine"
    (path, client, loaded_steps), _ = run_ranks(load_and_train, 1, str(tmp_path), 1, 1, timeout=180)[0]
    assert Path(path) == out and client == {"note": "mine"} and loaded_steps == steps


def test_namespace_arguments_and_universal_info_that_are_wrong_are_named(tmp_path, capsys):
    import types

    with pytest.raises(TypeError, match="output_folder"):
        ds_to_universal.main(types.SimpleNamespace(input_folder=str(tmp_path)))
    with pytest.raises(TypeError, match="num_extract_workers='2'"):
        ds_to_universal.main(types.SimpleNamespace(input_folder="a", output_folder="b", num_extract_workers="2"))
    with pytest.raises(TypeError, match="not a str"):
        ds_to_universal.main("--input_folder a")
    steps = run_ranks(save_with_universal_info, 1, str(tmp_path), timeout=180)[0]
    assert steps == 1
    from dstrain.checkpoint.universal import writer

    whole = ds_to_universal.read_checkpoint(tmp_path / "tagged")
    whole.client_state["universal_checkpoint_info"] = "patterns"
    with pytest.raises(CheckpointLoadError, match="'universal_checkpoint_info' is a str"):
        writer.write_universal(whole, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
