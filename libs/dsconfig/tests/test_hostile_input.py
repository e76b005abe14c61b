"""Hostile and absurd configs: each is a ConfigError naming where and what is valid, in well under a second.

The time bounds have wide slack for a loaded machine: the inputs take about 0.1 s with the limits in
place (limits.py), and took from seconds to minutes (or crashed) without them.
"""

import base64
import json
import time
import warnings

import pytest

import dsconfig
from dsconfig.cli import main as cli_main
from dsconfig.limits import MAX_DEPTH, MAX_KEY_CHARS, MAX_STRING_CHARS, MAX_TEXT_BYTES, MAX_VALUES

SLACK_S = 5.0  # each refusal below takes ~0.1 s; the bound only has to catch seconds-to-minutes regressions


def refused(source, **kwargs) -> dsconfig.ConfigError:
    """The ConfigError of loading `source`, asserting that it came fast."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dsconfig.ConfigWarning)
        with pytest.raises(dsconfig.ConfigError) as info:
            dsconfig.load(source, **kwargs)
    elapsed = time.perf_counter() - start
    assert elapsed < SLACK_S, f"took {elapsed:.1f} s"
    return info.value


def write(tmp_path, text: str, name: str = "ds_config.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def nested(depth: int, leaf: str = "1") -> str:
    return '{"a": ' * depth + leaf + "}" * depth


# ----------------------------------------------------------------- nesting
@pytest.mark.parametrize("text", [
    nested(2000),
    '{"a": ' + "[" * 2000 + "]" * 2000 + "}",
    '{"optimizer": {"type": "SGD", "params": {"x": ' + "[" * 5000 + "]" * 5000 + "}}}",
    '{"a": ' + "[" * 100_000,  # unclosed: the parser would recurse before it found the end
], ids=["objects", "lists", "in-free-form-params", "unclosed"])
def test_deep_nesting_is_refused_with_its_path(tmp_path, text):
    error = refused(write(tmp_path, text))
    assert len(error.problems) == 1 and f"deeper than {MAX_DEPTH} levels" in str(error)
    assert error.paths[0].startswith(("a.a.a", "a[0][0]", "optimizer.params.x[0][0]"))


def test_nesting_up_to_the_limit_loads_and_one_more_level_does_not(tmp_path):
    deepest = '{"_comment": ' + nested(MAX_DEPTH - 1) + "}"  # "_" keys are comments, but still parsed
    dsconfig.load(write(tmp_path, deepest))
    error = refused(write(tmp_path, '{"_comment": ' + nested(MAX_DEPTH) + "}"))
    assert error.paths == ["_comment" + ".a" * (MAX_DEPTH - 1)]


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    cfg = dsconfig.load(write(tmp_path, json.dumps({"tensorboard": {"job_name": "[" * 5000 + "{" * 5000}})))
    assert cfg.tensorboard.job_name.startswith("[[[")


def test_deep_and_self_referencing_dicts_are_refused():
    deep: dict = {}
    for _ in range(100_000):
        deep = {"a": deep}
    assert refused(deep).paths[0].startswith("a.a.a")
    loop: dict = {"optimizer": {"type": "SGD", "params": {}}}
    loop["optimizer"]["params"]["again"] = loop
    assert refused(loop).paths[0].startswith("optimizer.params.again.optimizer.params.again")


# ----------------------------------------------------------------- numbers
@pytest.mark.parametrize(("text", "path"), [
    ('{"steps_per_print": ' + "9" * 5000 + "}", "steps_per_print"),
    ('{"optimizer": {"type": "SGD", "params": {"lr": -' + "1" * 5000 + "}}}", "optimizer.params.lr"),
    ('{"_comment": [' + "7" * 100_000 + "]}", "_comment[0]"),
])
def test_integers_of_thousands_of_digits_are_refused_by_path(tmp_path, text, path):
    error = refused(write(tmp_path, text))
    assert error.paths == [path] and "digits does not fit in 64 bits" in str(error)


@pytest.mark.parametrize(("config", "path"), [
    ({"steps_per_print": 2**63}, "steps_per_print"),
    ({"zero_optimization": {"reduce_bucket_size": -(2**63) - 1}}, "zero_optimization.reduce_bucket_size"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2**63}}}, "scheduler.params.warmup_num_steps"),
    ({"optimizer": {"type": "SGD", "params": {"foreach_chunk": 2**64}}}, "optimizer.params.foreach_chunk"),
    ({"zero_optimization": {"reduce_bucket_size": 1e300}}, "zero_optimization.reduce_bucket_size"),
])
def test_integers_beyond_int64_are_refused_from_files_and_dicts(tmp_path, config, path):
    for source in (config, write(tmp_path, json.dumps(config))):
        error = refused(source)
        assert error.paths == [path] and "64" in str(error), str(error)
    assert dsconfig.load({"zero_optimization": {"stage3_max_live_parameters": 2**63 - 1}})


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused_as_not_json(tmp_path, literal):
    for text in (f'{{"gradient_clipping": {literal}}}',
                 f'{{"optimizer": {{"type": "Adam", "params": {{"lr": {literal}}}}}}}'):
        error = refused(write(tmp_path, text))
        assert "not valid JSON" in str(error) and literal in str(error)
        assert error.paths[0] in ("gradient_clipping", "optimizer.params.lr")


def test_floats_that_overflow_and_non_finite_dict_values_are_refused(tmp_path):
    error = refused(write(tmp_path, '{"gradient_clipping": 1e999}'))
    assert error.paths == ["gradient_clipping"] and "too large for a 64-bit float" in str(error)
    for value in (float("nan"), float("inf")):
        error = refused({"optimizer": {"type": "SGD", "params": {"momentum": value}}})
        assert error.paths == ["optimizer.params.momentum"] and "finite" in str(error)
    # The largest finite doubles are numbers like any other (no clipping, in effect).
    start = time.perf_counter()
    assert dsconfig.load(write(tmp_path, '{"gradient_clipping": 1e308}')).gradient_clipping == 1e308
    assert time.perf_counter() - start < SLACK_S


# ----------------------------------------------------------------- size: keys, values, lists, strings
def test_hundreds_of_thousands_of_unknown_keys_are_refused_fast(tmp_path):
    many = {f"key_{i}": 1 for i in range(300_000)}
    error = refused(write(tmp_path, json.dumps(many)))  # 4 MB of text: the file size is the first limit
    assert f"at most {MAX_TEXT_BYTES} bytes" in str(error)
    error = refused(many)  # the same as a dict: the value count
    assert f"more than {MAX_VALUES} values" in str(error)
    start = time.perf_counter()
    assert cli_main(["check", str(tmp_path / "ds_config.json")]) == 1
    assert time.perf_counter() - start < SLACK_S


@pytest.mark.parametrize("section", ["", "zero_optimization", "optimizer.params", "scheduler.params"])
def test_thousands_of_unknown_keys_are_listed_up_to_a_cap(tmp_path, section):
    count = MAX_VALUES - 10
    config: dict = {f"train_batch_siz{i}": 1 for i in range(count)}  # close to a real key: difflib's worst case
    if section == "zero_optimization":
        config = {"zero_optimization": config}
    elif section:
        kind, typename = ("optimizer", "AdamW") if section.startswith("optimizer") else ("scheduler", "WarmupLR")
        config = {kind: {"type": typename, "params": config}}
    path = write(tmp_path, json.dumps(config))
    error = refused(path)
    prefix = f"{section}." if section else ""
    assert len(error.problems) == count and error.paths[0] == f"{prefix}train_batch_siz0"
    message = str(error)
    assert f"and {count - 30} more" in message and len(message) < 10_000
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dsconfig.load(path, strict=False)
    assert time.perf_counter() - start < SLACK_S
    unknown = [str(w.message) for w in caught if "unknown keys" in str(w.message)]
    assert len(unknown) == 1 and f"and {count - 30} more" in unknown[0] and len(unknown[0]) < 10_000


def test_long_lists_are_refused_by_size_or_listed_up_to_a_cap(tmp_path):
    error = refused(write(tmp_path, json.dumps({"compile": {"passes": ["autotp"] * 1_000_000}})))
    assert "bytes long" in str(error)
    error = refused({"compile": {"passes": ["autotp"] * 1_000_000}})
    assert f"more than {MAX_VALUES} values" in str(error)
    error = refused(write(tmp_path, json.dumps({"compile": {"passes": ["x"] * (MAX_VALUES - 10)}})))
    assert error.paths[-1] == f"compile.passes[{MAX_VALUES - 11}]" and len(str(error)) < 10_000


def test_a_megabyte_of_tiny_values_is_refused_fast(tmp_path):
    text = '{"_x": [' + ",".join(["[]"] * (MAX_TEXT_BYTES // 3 - 10)) + "]}"
    assert f"more than {MAX_VALUES} values" in str(refused(write(tmp_path, text)))


def test_huge_strings_and_keys_are_refused(tmp_path):
    error = refused(write(tmp_path, json.dumps({"tensorboard": {"job_name": "x" * 50_000_000}})))
    assert "bytes long" in str(error)
    error = refused({"tensorboard": {"job_name": "x" * (MAX_STRING_CHARS + 1)}})
    assert error.paths == ["tensorboard.job_name"] and f"at most {MAX_STRING_CHARS}" in str(error)
    error = refused(write(tmp_path, json.dumps({"k" * 500_000: 1})))
    assert f"at most {MAX_KEY_CHARS}" in str(error) and len(str(error)) < 500


def test_huge_json_and_base64_text_sources_are_refused():
    text = json.dumps({"_x": "y" * (2 * MAX_TEXT_BYTES)})
    for source in (text, base64.b64encode(text.encode()).decode()):
        assert "characters long" in str(refused(source))


def test_many_duplicate_keys_are_one_error_with_lines(tmp_path):
    text = "{\n" + ",\n".join('"train_batch_size": 8' for _ in range(MAX_TEXT_BYTES // 24)) + "\n}"
    error = refused(write(tmp_path, text))
    assert error.paths == ["train_batch_size"] and "lines 2 and 3" in str(error)


def test_non_string_keys_of_a_dict_are_refused():
    error = refused({"zero_optimization": {1: 2}})
    assert error.paths == ["zero_optimization"] and "not a string" in str(error)


# ----------------------------------------------------------------- optimizer and scheduler params
@pytest.mark.parametrize(("section", "params", "path", "valid"), [
    ("Adam", {"lr": -0.1}, "optimizer.params.lr", ">= 0"),
    ("AdamW", {"betas": [0.9, 1.0]}, "optimizer.params.betas[1]", "in [0, 1)"),
    ("Adam", {"betas": [-0.1, 0.999]}, "optimizer.params.betas[0]", "in [0, 1)"),
    ("Lamb", {"eps": 0}, "optimizer.params.eps", "> 0"),
    ("Adam", {"weight_decay": -1e-4}, "optimizer.params.weight_decay", ">= 0"),
    ("Muon", {"momentum": 1.0}, "optimizer.params.momentum", "in [0, 1)"),
    ("Muon", {"ns_steps": 0}, "optimizer.params.ns_steps", ">= 1"),
    ("SGD", {"lr": -1}, "optimizer.params.lr", ">= 0"),  # a torch optimizer: the ranges torch checks too
    ("SGD", {"momentum": 1.5}, "optimizer.params.momentum", "in [0, 1)"),
    ("RAdam", {"betas": [0.9, 2]}, "optimizer.params.betas[1]", "in [0, 1)"),
    ("WarmupLR", {"warmup_num_steps": -5}, "scheduler.params.warmup_num_steps", ">= 0"),
    ("WarmupLR", {"warmup_max_lr": -1e-3}, "scheduler.params.warmup_max_lr", ">= 0"),
    ("WarmupCosineLR", {"cos_min_ratio": 1.5}, "scheduler.params.cos_min_ratio", "in [0, 1]"),
    ("OneCycle", {"cycle_max_mom": 1.0}, "scheduler.params.cycle_max_mom", "in [0, 1)"),
    ("OneCycle", {"cycle_first_step_size": 0}, "scheduler.params.cycle_first_step_size", ">= 1"),
    ("LRRangeTest", {"lr_range_test_step_size": 0}, "scheduler.params.lr_range_test_step_size", ">= 1"),
])
def test_params_out_of_range_are_refused_by_path(section, params, path, valid):
    kind = "scheduler" if path.startswith("scheduler") else "optimizer"
    for strict in (True, False):
        error = refused({kind: {"type": section, "params": params}}, strict=strict)
        assert error.paths == [path] and f"must be {valid}" in str(error), str(error)


def test_params_at_the_edges_of_their_ranges_load():
    edges = {"lr": 0, "betas": [0, 0.999999], "eps": 1e-30, "weight_decay": 0}
    assert dsconfig.load({"optimizer": {"type": "AdamW", "params": edges}}).optimizer.params == edges
    dsconfig.load({"optimizer": {"type": "Muon", "params": {"momentum": 0, "lr": "auto"}}})
    dsconfig.load({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}})
    dsconfig.load({"scheduler": {"type": "WarmupCosineLR", "params": {"cos_min_ratio": 1, "warmup_min_ratio": 0}}})


def test_a_negative_data_sampling_seed_is_refused():
    assert refused({"data_efficiency": {"seed": -1}}).paths == ["data_efficiency.seed"]


def test_importing_dsconfig_loads_no_torch():
    import subprocess
    import sys

    code = "import sys, dsconfig; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_steps_per_print_inf_from_accelerate_means_never_and_is_the_only_infinity_taken():
    # Accelerate's DeepSpeedPlugin silences DeepSpeed's progress line with steps_per_print = inf.
    assert dsconfig.load({"train_batch_size": 2, "steps_per_print": float("inf")}).steps_per_print >= 2**62
    error = refused({"train_batch_size": 2, "steps_per_print": float("-inf")})
    assert error.paths == ["steps_per_print"]


def test_accelerates_null_nvme_path_is_not_given():
    raw = {"train_batch_size": 2, "zero_optimization": {"stage": 3, "offload_param": {"device": "none", "nvme_path": None},
                                                        "offload_optimizer": {"device": "none", "nvme_path": None}}}
    cfg = dsconfig.load(raw)
    assert cfg.zero_optimization.offload_param.nvme_path == "/local_nvme"
    assert raw["zero_optimization"]["offload_param"]["nvme_path"] is None  # the caller's dict is untouched
    error = refused({"train_batch_size": 2, "zero_optimization": {"stage": 3, "offload_param": {"device": 5}}})
    assert error.paths == ["zero_optimization.offload_param.device"]
