"""The Hugging Face path trains as one rank on the whole sequence: tiny Llama (key/value heads split over 2
ranks, repeated over 4), Qwen2 and Mistral through register_with_transformers and the data-loader adapter,
float64: every step's loss, every gradient (averaged over the sequence ranks, as ZeRO's sequence x data
group does) and the weights after the steps. Labels masked with -100 (an SFT prompt) weigh each rank's
tokens correctly. What Ulysses cannot honour is refused by name."""

import copy

import pytest
import tiny_models
import torch

import dscomm
from dscomm.testing import run_ranks
from dsseq import (
    SequenceParallelError,
    UlyssesSPAttentionHF,
    UlyssesSPDataLoaderAdapter,
    restore_transformers_attention,
    sequence_parallel_loss,
)

TOL = 1e-9


@pytest.fixture(autouse=True, scope="module")
def _modeling_code_loaded_before_forking():
    tiny_models.warm("llama", "qwen2", "mistral")
SEQ = 16
PER_RANK = 2  # batches in each rank's loader


def sample(rank, index):
    ids = tiny_models.tokens(10 * rank + index, seq=SEQ)
    labels = ids.clone()
    if index == 1:
        labels[:, : SEQ // 2 + 3] = -100  # a prompt: rank 0's half holds no label at all
    return {"input_ids": ids, "position_ids": torch.arange(SEQ)[None], "labels": labels}


def train(rank, world, family, extra):
    model = tiny_models.model(family, **extra)
    reference = copy.deepcopy(model)
    # The adapter serves rank 0's first batch, rank 1's first batch, ..., then everyone's second.
    order = [sample(r, i) for i in range(PER_RANK) for r in range(world)]
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    expected = []
    for whole in order:  # before registering: the reference runs transformers' own sdpa
        loss = tiny_models.whole_sequence_loss(reference, whole["input_ids"], whole["labels"])
        loss.backward()
        expected.append((loss.item(), {n: p.grad.clone() for n, p in reference.named_parameters()}))
        ref_opt.step()
        ref_opt.zero_grad()

    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", sequence_parallel_size=world,
                                                          micro_batch_size=1)
    assert dscomm.groups.get_sequence_parallel_world_size() == world  # registered as the layout
    group = mpu.get_sequence_parallel_group()
    loader = UlyssesSPDataLoaderAdapter([sample(rank, i) for i in range(PER_RANK)], mpu.get_sequence_parallel_rank(),
                                        group, mpu.get_sequence_parallel_world_size(), "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    for step, piece in enumerate(loader):
        out = model(input_ids=piece["input_ids"], position_ids=piece["position_ids"])
        loss = sequence_parallel_loss(out.logits, piece["shift_labels"], group)
        loss.backward()
        ref_loss, ref_grads = expected[step]
        worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss))
        for name, param in model.named_parameters():
            dscomm.all_reduce(param.grad, group=group)
            param.grad /= world
            worst["grad"] = max(worst["grad"], (param.grad - ref_grads[name]).abs().max().item())
        optimizer.step()
        optimizer.zero_grad()
    ref_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        worst["param"] = max(worst["param"], (param - ref_params[name]).abs().max().item())
    restore_transformers_attention()
    return step + 1, worst


@pytest.mark.parametrize(("family", "world", "extra"), [
    ("llama", 2, {}),
    ("llama", 4, {}),  # 2 key/value heads over 4 ranks: each repeated to two ranks
    ("qwen2", 2, {}),
    ("mistral", 2, {"num_hidden_layers": 1}),
])
def test_trains_as_one_rank_on_the_whole_sequence(family, world, extra):
    for steps, worst in run_ranks(train, world, family, extra, timeout=240):
        assert steps == world * PER_RANK
        assert max(worst.values()) < TOL, worst


def refusals(rank, world):
    messages = {}

    def attempt(name, call):
        try:
            call()
        except SequenceParallelError as exc:
            messages[name] = str(exc)

    model = tiny_models.model("llama", num_hidden_layers=1)
    attempt("eager", lambda: UlyssesSPAttentionHF.register_with_transformers(
        tiny_models.model("llama", num_hidden_layers=1, attn_implementation="eager"), "eager", 2, 1))
    attempt("mismatch", lambda: UlyssesSPAttentionHF.register_with_transformers(model, "flash_attention_2", 2, 1))
    attempt("heads", lambda: UlyssesSPAttentionHF.register_with_transformers(
        tiny_models.model("llama", hidden_size=24, num_attention_heads=3, num_key_value_heads=3), "sdpa", 2, 1))
    attempt("seq_length", lambda: UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", 2, 1, seq_length=15,
                                                                                  seq_length_is_variable=False))
    UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", 2, 1)
    ids = tiny_models.tokens(0, seq=8)
    attempt("positions", lambda: model(input_ids=ids))
    padding = torch.ones(1, 8, dtype=torch.long)
    padding[0, 6:] = 0
    attempt("padding", lambda: model(input_ids=ids, position_ids=torch.arange(8)[None] + 8 * rank,
                                     attention_mask=padding))
    attempt("packed", lambda: model(input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])))
    restore_transformers_attention()
    return messages


def test_what_ulysses_cannot_honour_is_refused_by_name():
    messages = run_ranks(refusals, 2, timeout=120)[0]
    assert "'eager' attention takes a mask built for each rank's slice" in messages["eager"]
    assert "core_attn_implementation 'flash_attention_2' but the model's config uses 'sdpa'" in messages["mismatch"]
    assert "3 query heads do not split evenly over sequence-parallel size 2" in messages["heads"]
    assert "seq_length 15 is not divisible by sequence_parallel_size 2" in messages["seq_length"]
    # transformers numbers a slice from 0 when position_ids are missing: the gathered positions restart
    assert "the forward call lacks position_ids" in messages["positions"]
    assert "an attention_mask with padding cannot be carried over the sequence ranks" in messages["padding"]
    assert "the gathered position_ids restart inside a sample" in messages["packed"]
