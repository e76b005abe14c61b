"""Hugging Face's Trainer with `TrainingArguments(deepspeed=config)`, on dstrain, at 2 gloo ranks."""

from __future__ import annotations

import os

import pytest
import torch
import transformers  # noqa: F401  (loaded once here, so the forked ranks start fast)
from hf_runs import (
    Tokens,
    auto_config,
    filled_config,
    join_as_accelerate_rank,
    mean_over_ranks,
    reset_accelerate,
    tiny_llama,
)

from dscomm.testing import run_ranks

STEPS, MICRO, LR = 4, 2, 1e-2


def _arguments(out: str, config: dict, **overrides):
    from transformers import TrainingArguments

    settings = dict(output_dir=out, per_device_train_batch_size=MICRO, max_steps=STEPS, logging_steps=1,
                    learning_rate=LR, deepspeed=config, report_to=[], save_strategy="no",
                    train_sampling_strategy="sequential", accelerator_config={"use_configured_state": True},
                    disable_tqdm=True)
    return TrainingArguments(**{**settings, **overrides})


def _logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _engine_losses(stage: int, rank: int, world: int) -> list[float]:
    """The same model and batches through dstrain.initialize and the engine's loop, as a DeepSpeed script."""
    import dstrain

    engine, *_ = dstrain.initialize(model=tiny_llama(), config=filled_config(stage, world, micro=MICRO, lr=LR,
                                                                             steps=STEPS))
    data, losses = Tokens(), []
    for step in range(STEPS):
        # The sequential sampler's batches, dealt out in turn: rank r takes batch r of each group of `world`.
        first = (step * world + rank) * MICRO
        batch = {key: torch.stack([data[i][key] for i in range(first, first + MICRO)]) for key in ("input_ids", "labels")}
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(mean_over_ranks(loss.item()))
    return losses


def _trainer_and_engine(rank: int, world: int, out: str, model_dir: str) -> dict:
    from transformers import LlamaForCausalLM, Trainer

    join_as_accelerate_rank(rank, world)
    result = {}
    for stage in (2, 3):
        args = _arguments(out, auto_config(stage))
        # As Hugging Face's documentation orders it: the arguments (and their DeepSpeed config) first, so that at
        # ZeRO-3 from_pretrained builds the model under deepspeed.zero.Init.
        model = LlamaForCausalLM.from_pretrained(model_dir)
        partitioned = all(p.numel() == 0 for p in model.parameters())
        trainer = Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
        engine = trainer.model_wrapped
        result[stage] = {"trainer": _logged_losses(trainer), "engine": _engine_losses(stage, rank, world),
                         "engine_type": f"{type(engine).__module__}.{type(engine).__name__}",
                         "stage": engine.zero_optimization_stage(), "partitioned": partitioned}
        reset_accelerate()
    return result


def test_trainer_at_zero_2_and_3_logs_the_losses_of_the_engine_trained_directly(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "model")
    results = run_ranks(_trainer_and_engine, 2, str(tmp_path), str(tmp_path / "model"), timeout=240)
    for stage, run in results[0].items():
        assert run["engine_type"] == "dstrain.engine.deepspeed_engine.DeepSpeedEngine" and run["stage"] == stage
        assert run["partitioned"] == (stage == 3)
        assert len(run["trainer"]) == STEPS
        # The Trainer normalises by the tokens of every rank, the script by its own: equal up to rounding.
        assert run["trainer"] == pytest.approx(run["engine"], rel=1e-6, abs=1e-6), stage
    assert results[0][2]["trainer"] == pytest.approx(results[0][3]["trainer"], rel=1e-6)
    assert results[0] == results[1]  # the logged losses are every rank's mean


def _train_and_save(rank: int, world: int, out: str) -> list[float]:
    from transformers import Trainer

    join_as_accelerate_rank(rank, world)
    trainer = Trainer(model=tiny_llama(), args=_arguments(out, auto_config(3), save_strategy="steps", save_steps=2),
                      train_dataset=Tokens())
    trainer.train()
    trainer.save_model(os.path.join(out, "final-16bit"))  # stage3_gather_16bit_weights_on_model_save: true
    return _logged_losses(trainer)


def _resume_and_load(rank: int, world: int, out: str) -> dict:
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import load_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM, Trainer

    join_as_accelerate_rank(rank, world)
    # Gathering 16-bit weights off: save_model writes the engine's checkpoint, from which fp32 weights are rebuilt.
    args = _arguments(out, auto_config(3, gather_16bit=False))
    trainer = Trainer(model=tiny_llama(seed=5), args=args, train_dataset=Tokens())
    trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
    trainer.save_model(os.path.join(out, "final-fp32"))
    # The args' DeepSpeed config (stage 3) is live: from_pretrained builds the model under deepspeed.zero.Init.
    model = LlamaForCausalLM.from_pretrained(os.path.join(out, "final-16bit"))
    saved = load_file(os.path.join(out, "final-16bit", "model.safetensors"))
    partitioned, equal = [], []
    for name, param in model.named_parameters():
        partitioned.append(param.numel() == 0 and tuple(param.ds_shape) == tuple(saved[name].shape)
                           and param.ds_status == deepspeed.runtime.zero.partition_parameters.ZeroParamStatus.NOT_AVAILABLE)
        with deepspeed.zero.GatheredParameters([param]):
            equal.append(torch.equal(param.detach(), saved[name]))
    fp32_equal = None
    if rank == 0:
        rebuilt = load_state_dict_from_zero_checkpoint(tiny_llama(seed=7), os.path.join(out, "final-fp32"))
        fp32_equal = all(torch.equal(rebuilt.state_dict()[name], value) for name, value in saved.items())
    return {"losses": _logged_losses(trainer), "partitioned": all(partitioned), "loaded": all(equal),
            "fp32_equal": fp32_equal}


def test_a_zero3_trainer_checkpoint_resumes_exactly_and_its_saved_models_load(tmp_path):
    first = run_ranks(_train_and_save, 2, str(tmp_path), timeout=240)[0]
    assert {"global_step2", "latest", "trainer_state.json"} <= set(os.listdir(tmp_path / "checkpoint-2"))
    resumed = run_ranks(_resume_and_load, 2, str(tmp_path), timeout=240)
    # Steps 3 and 4 after resuming from step 2 are those of the uninterrupted run, bit for bit.
    assert resumed[0]["losses"][2:] == first[2:]
    for rank in resumed:
        assert rank["partitioned"], "from_pretrained under zero.Init left whole parameters"
        assert rank["loaded"], "the gathered parameters differ from the saved 16-bit model"
    # The fp32 weights rebuilt from the final checkpoint are the weights save_model gathered after the same steps.
    assert resumed[0]["fp32_equal"] is True
