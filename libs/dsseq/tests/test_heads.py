"""The head split is pure arithmetic: every count of 1-16 query heads, their GQA groups and 1-8 ranks."""

import pytest

from dsseq import SequenceParallelError, split_heads


@pytest.mark.parametrize("sp", range(1, 9))
def test_every_split_gives_each_rank_the_key_value_heads_its_queries_read(sp):
    for q in range(1, 17):
        for kv in (d for d in range(1, q + 1) if q % d == 0):
            if q % sp or not (kv % sp == 0 or sp % kv == 0):
                with pytest.raises(SequenceParallelError):
                    split_heads(q, kv, sp)
                continue
            split = split_heads(q, kv, sp)
            group = q // kv
            for rank in range(sp):
                queries = range(rank * split.local_q, (rank + 1) * split.local_q)
                # after repeating each kv head kv_repeat times, rank r holds repeated heads [r*local_kv, ...)
                held = {h // split.kv_repeat for h in range(rank * split.local_kv, (rank + 1) * split.local_kv)}
                assert {head // group for head in queries} == held, (q, kv, sp, rank)
                assert split.local_groups * split.local_kv == split.local_q


@pytest.mark.parametrize(("args", "message"), [
    ((6, 6, 4), "6 query heads do not split evenly over sequence-parallel size 4; Ulysses gives each rank whole "
                "heads, so the size must divide the head count: one of [1, 2, 3, 6]"),
    ((6, 3, 2), "3 key/value heads neither split over nor divide sequence-parallel size 2"),
    ((8, 3, 2), "8 query heads are not a multiple of 3 key/value heads"),
    ((8, 2, 0), "sequence-parallel size must be a positive integer, got 0"),
])
def test_refusals_name_the_numbers(args, message):
    with pytest.raises(SequenceParallelError, match="attention: ") as caught:
        split_heads(*args)
    assert message in str(caught.value)
