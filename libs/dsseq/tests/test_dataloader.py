"""Sharding batches along the sequence: labels shifted over the whole sequence before the cut (the label at
each boundary survives), every tensor cut alike, and the adapter serving every sequence rank's batch in turn
on 2 gloo ranks; bad batches are refused by name."""

import pytest
import torch

import dscomm
from dscomm.testing import run_ranks
from dsseq import SequenceParallelError, UlyssesSPDataLoaderAdapter, shard_batch


def batch(seed, seq=8, batch_size=2):
    ids = torch.arange(seq).repeat(batch_size, 1) + 100 * seed
    return {"input_ids": ids, "position_ids": torch.arange(seq).repeat(batch_size, 1), "labels": ids.clone(),
            "source": f"doc-{seed}"}


def test_labels_are_shifted_before_the_cut():
    whole = batch(0)
    shards = [shard_batch(whole, rank, 2) for rank in range(2)]
    assert "labels" not in shards[0]
    assert shards[0]["shift_labels"][0].tolist() == [1, 2, 3, 4]  # 4: the first token of the next shard
    assert shards[1]["shift_labels"][0].tolist() == [5, 6, 7, -100]
    assert shards[1]["position_ids"][0].tolist() == [4, 5, 6, 7]
    assert torch.equal(torch.cat([s["input_ids"] for s in shards], dim=1), whole["input_ids"])
    assert shards[1]["source"] == "doc-0"


@pytest.mark.parametrize(("change", "message"), [
    (lambda b: b.pop("position_ids"), "the batch lacks position_ids"),
    (lambda b: b.update(labels=torch.zeros(2, 7, dtype=torch.long)),
     r"batch\['labels'\] of shape \(2, 7\) does not have input_ids' sequence length 8"),
    (lambda b: b.update(input_ids=torch.zeros(2, 9, dtype=torch.long), position_ids=torch.zeros(2, 9),
                        labels=torch.zeros(2, 9)), r"sequence length 9 .* is not divisible by the sequence-parallel "
                                                   r"size 2; pad or cut it to a multiple of 2 \(e.g. 8 or 10\)"),
])
def test_bad_batches_are_named(change, message):
    bad = batch(0)
    change(bad)
    with pytest.raises(SequenceParallelError, match=message):
        shard_batch(bad, 0, 2)


def serve(rank, world, seq):
    sp = dscomm.ParallelDims(world, sequence=world).build()
    loader = [batch(10 * rank + i, seq) for i in range(2)]  # each rank's loader yields its own batches
    adapter = UlyssesSPDataLoaderAdapter(loader, sp.rank_in("sequence"), sp.sequence, world, "cpu")
    try:
        epochs = [[(b["input_ids"].tolist(), b["shift_labels"].tolist(), b["source"]) for b in adapter]
                  for _ in range(2)]
    except SequenceParallelError as exc:
        return str(exc)
    return len(adapter), epochs


def test_the_adapter_serves_every_ranks_batch_in_turn():
    results = run_ranks(serve, 2, 8, timeout=90)
    for rank, (length, epochs) in enumerate(results):
        assert length == 4 and epochs[0] == epochs[1]  # a second epoch starts afresh
        sources = [source for _, _, source in epochs[0]]
        assert sources == ["doc-0", "doc-10", "doc-1", "doc-11"]  # rank 0's first, rank 1's first, ...
        for (ids, shifted, _), seed in zip(epochs[0], (0, 10, 1, 11)):
            expected = shard_batch(batch(seed), rank, 2)
            assert ids == expected["input_ids"].tolist() and shifted == expected["shift_labels"].tolist()


def test_the_adapter_refuses_an_indivisible_length_on_every_rank():
    messages = run_ranks(serve, 2, 7, timeout=90)
    assert all("sequence length 7" in m and "not divisible by the sequence-parallel size 2" in m for m in messages)
