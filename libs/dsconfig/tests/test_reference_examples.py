"""Every JSON example block of the config reference loads.

reference_examples.json holds the blocks as the reference prints them (with their line numbers).
Many are fragments or carry documentation notation, so the same mechanical repairs are applied to
all of them, and nothing else: wrap a `"key": {...}` fragment in braces, drop trailing commas, read
`"key"=value` as `"key": value`, take the last choice of a `[a|b]` placeholder, and read a `...`
body as {}. A block documenting a sub-section (offload_param, offload_optimizer) is placed in its
parent, and the bf16 master-weights block, which the reference's support matrix allows only with
ZeRO 1-3, is read with stage 1.
"""

import json
import re
import warnings
from pathlib import Path

import pytest

import dsconfig

BLOCKS = json.loads((Path(__file__).parent / "reference_examples.json").read_text())


def repair(text: str) -> str:
    text = text.strip().rstrip(",")
    if not text.startswith("{"):
        text = "{" + text + "}"
    text = re.sub(r'"\s*=\s*', '": ', text)                          # "key"=value
    text = re.sub(r"\[([^\[\]]*?\|[^\[\]]*?)\]", lambda m: m.group(1).split("|")[-1], text)  # [a|b]
    text = re.sub(r'"\[([a-z|]+)\]"', lambda m: '"' + m.group(1).split("|")[-1] + '"', text)  # "[cpu|nvme]"
    text = re.sub(r"\)?\s*\(deprecated[^)]*\)", "", text)              # prose after a value
    text = re.sub(r"\{\s*\.\.\.\s*\}", "{}", text)                     # { ... }
    text = re.sub(r",(\s*[}\]])", r"\1", text)                         # trailing commas
    return text


CONTEXT = {
    "offload_param": lambda section: {"zero_optimization": {"stage": 3, **section}},
    "offload_optimizer": lambda section: {"zero_optimization": {"stage": 3, **section}},
    "bf16": lambda section: {"zero_optimization": {"stage": 1}, **section},
}


def load_block(block, **kwargs):
    data = json.loads(repair(block["text"]))
    (head,) = data if len(data) == 1 else (None,)
    data = CONTEXT.get(head, lambda section: section)(data)
    return dsconfig.load(data, world_size=4, **kwargs)


# The reference's own Comet example has a 31-character experiment_key, below the 32 to 50 that
# the same page requires; it is refused for exactly that, and loads once the key is 32 long.
COMET_LINE = next(b["line"] for b in BLOCKS if b["text"].lstrip().startswith('"comet"'))


@pytest.mark.parametrize("block", [b for b in BLOCKS if b["line"] != COMET_LINE], ids=lambda b: f"line{b['line']}")
def test_example_block_loads(block):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_block(block, strict=False)
    unknown = [str(w.message) for w in caught if "unknown keys" in str(w.message)]
    assert not unknown, unknown


def test_reference_comet_example_breaks_its_own_key_length_rule():
    block = next(b for b in BLOCKS if b["line"] == COMET_LINE)
    with pytest.raises(dsconfig.ConfigError) as info:
        load_block(block)
    assert info.value.paths == ["comet.experiment_key"]
    fixed = dict(block, text=block["text"].replace("b19a9d7", "b19a9d70"))
    cfg = load_block(fixed)
    assert cfg.comet.mode == "get" and cfg.comet.samples_log_interval == 50


def test_examples_set_what_they_say():
    by_head = {b["text"].strip().split(":")[0].strip('{" \n'): b for b in BLOCKS}
    assert load_block(by_head["aio"]).aio.queue_depth == 8
    ltd = load_block(by_head["data_efficiency"]).data_efficiency.data_routing.random_ltd
    assert ltd.random_ltd_layer_num == len(ltd.random_ltd_layer_id) == 22
    assert load_block(by_head["checkpoint"]).checkpoint.tag_validation == "Warn"
    assert load_block(by_head["data_types"]).data_types.grad_accum_dtype == "bf16"


def test_zero_example_reports_its_deprecated_key_only_under_strict():
    block = next(b for b in BLOCKS if '"elastic_checkpoint"' in b["text"])
    with pytest.raises(dsconfig.ConfigError) as info:
        load_block(block, strict=True)
    assert info.value.paths == ["zero_optimization.elastic_checkpoint"]
