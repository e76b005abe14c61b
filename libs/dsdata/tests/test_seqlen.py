"""The reference seqlen post-processing functions: truncate and reshape to the current difficulty."""

import pytest
import torch

from dsdata import DataEfficiencyError, reshape, seqlen_post_process, truncate


def test_truncate_and_reshape():
    tokens = torch.arange(2 * 10).reshape(2, 10)
    assert truncate(tokens, 4).tolist() == [[0, 1, 2, 3], [10, 11, 12, 13]]
    assert truncate(tokens, 40).shape == (2, 10)
    assert reshape(tokens, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [10, 11, 12, 13], [14, 15, 16, 17]]
    assert reshape(tokens, 10) is tokens


def test_post_process_reads_the_batch_difficulty_from_the_sampler_state():
    state = {"current_difficulties": {"seqlen": 3}}
    batch = {"input_ids": torch.zeros(2, 8), "labels": torch.ones(2, 8), "index": torch.arange(2)}
    cut = seqlen_post_process("seqlen", extra_tokens=1)(batch, state)
    assert cut["input_ids"].shape == (2, 4) and cut["labels"].shape == (2, 4) and cut["index"].shape == (2,)
    only = seqlen_post_process("seqlen", keys=["input_ids"])(batch, state)
    assert only["input_ids"].shape == (2, 3) and only["labels"].shape == (2, 8)
    assert seqlen_post_process("seqlen", mode="reshape")(torch.zeros(2, 9), state).shape == (6, 3)
    pair = seqlen_post_process("seqlen")((torch.zeros(2, 8), torch.zeros(2)), state)
    assert pair[0].shape == (2, 3) and pair[1].shape == (2,)
    with pytest.raises(DataEfficiencyError, match="no curriculum metric 'seqlen_truncate'"):
        seqlen_post_process("seqlen_truncate")(batch, state)
