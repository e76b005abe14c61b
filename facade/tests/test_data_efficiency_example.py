"""The data-efficiency example (facade/examples/train_gpt_data_efficiency.py): a small GPT finetune with a
two-metric curriculum and random-LTD trains, and its loss falls."""

import sys
from pathlib import Path

from dscomm.testing import run_ranks

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(rank, world, out):
    sys.path.insert(0, str(EXAMPLES))
    import train_gpt_data_efficiency as example

    args = example.parse_args(["--steps", "40", "--corpus-mb", "0.1", "--d-model", "64", "--layers", "4",
                               "--out", out])
    return example.run(args)


def test_curriculum_and_random_ltd_train_and_the_loss_falls(tmp_path):
    result = run_ranks(_run, 2, str(tmp_path), timeout=300)[0]
    assert result["last"] < result["first"] - 0.5, result
    assert result["lengths"] == (32, 64)  # the seqlen curriculum: half the context first, all of it at the end
    assert result["consumed_layer_tokens"] < 4 * result["consumed_tokens"]  # the middle blocks dropped tokens
    assert (tmp_path / "analysis" / "rarity" / "rarity_index_to_sample_percentile_merged.idx").exists()
