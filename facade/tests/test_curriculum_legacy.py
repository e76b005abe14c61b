"""The legacy top-level curriculum_learning (seqlen): a corpus config trains, the model's forward gets
curriculum_seqlen along DeepSpeed's schedule (the forward of global step g gets the difficulty of g + 1),
through accumulation and an exact resume, and a model that cannot take it is refused by key."""

import json

import pytest
import torch
from corpus_run import CORPUS, as_a_script_would_run_it
from engine_models import ADAMW, TinyLM, TokenDataset, config

import dstrain
from dscomm.testing import run_ranks

CORPUS_CONFIG = "microsoft__Megatron-DeepSpeed__examples__curriculum_learning__ds_config_cl.json"


class SeqlenLM(TinyLM):
    """TinyLM that trains on the first curriculum_seqlen tokens, as Megatron's GPT does, and records them."""

    def __init__(self):
        torch.manual_seed(0)
        super().__init__(d=16)
        self.seen = []

    def forward(self, tokens, curriculum_seqlen=None):
        self.seen.append(curriculum_seqlen)
        if curriculum_seqlen is not None:
            tokens = tokens[:, :curriculum_seqlen + 1]
        return super().forward(tokens)


def _corpus(rank, world, scratch):
    raw = json.loads((CORPUS / CORPUS_CONFIG).read_text())
    model = SeqlenLM()
    # Megatron passes its own optimizer (the config's Adam carries Megatron's max_grad_norm); the client's wins.
    with pytest.warns(UserWarning, match="optimizer"):
        engine, *_ = dstrain.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                        config=as_a_script_would_run_it(raw, scratch))
    data = TokenDataset(seq=24).data
    losses = []
    for i in range(3):
        loss = engine(data[2 * i:2 * i + 2])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return model.seen, losses


def test_a_legacy_seqlen_config_from_the_corpus_trains(tmp_path):
    seen, losses = run_ranks(_corpus, 2, str(tmp_path), timeout=180)[0]
    assert seen == [8, 8, 8]  # min_difficulty 8; the schedule takes 60000 steps to grow
    assert all(torch.isfinite(torch.tensor(losses)))


LEGACY = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 4, "max_difficulty": 12,
          "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 2}}


def _schedule_and_resume(rank, world, checkpoints):
    def build():
        model = SeqlenLM()
        engine, *_ = dstrain.initialize(model=model, config=config(micro=2, gas=2, optimizer=ADAMW,
                                                                     curriculum_learning=LEGACY))
        return model, engine

    def steps(engine, count):
        for i in range(2 * count):
            engine.backward(engine(data[2 * i:2 * i + 2]))
            engine.step()

    data = TokenDataset().data
    model, engine = build()
    steps(engine, 2)
    engine.save_checkpoint(checkpoints, tag="two")
    steps(engine, 3)
    engine.eval()
    engine(data[:2])  # evaluation gets no curriculum_seqlen
    resumed_model, resumed = build()
    resumed.load_checkpoint(checkpoints, tag="two")
    steps(resumed, 3)
    return model.seen, resumed_model.seen


def test_forward_gets_the_schedule_through_accumulation_and_resume(tmp_path):
    seen, resumed = run_ranks(_schedule_and_resume, 1, str(tmp_path), timeout=180)[0]
    # difficulty(g + 1) for global step g: 4 + 2 (g + 1) rounded down to even, at most 12; two micro-batches each
    assert seen == [6, 6, 8, 8, 10, 10, 12, 12, 12, 12, None]
    assert resumed == [10, 10, 12, 12, 12, 12]


def _plain_model(rank, world):
    with pytest.raises(dstrain.ConfigError, match=r"curriculum_learning\.curriculum_type") as info:
        dstrain.initialize(model=TinyLM(), config=config(optimizer=ADAMW, curriculum_learning=LEGACY))
    return str(info.value)


def test_a_model_without_curriculum_seqlen_is_refused_by_key():
    assert "curriculum_seqlen" in run_ranks(_plain_model, 1, timeout=120)[0]
