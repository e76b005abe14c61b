"""Partition planning as pure functions: every rule source and every refusal, by name (no processes)."""

from typing import ClassVar

import pytest
import torch

import dstp
from dstp import LayerSpec, ModelGeometry, ParamInfo, TensorParallelError, build_plan
from dstp.rules import resolve_specs

GQA = ModelGeometry(model_type="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    vocab_size=64)


def llama_params(layers=1, tied=False):
    params = [ParamInfo("model.embed_tokens.weight", (64, 32), "embedding", ("lm_head.weight",) if tied else ())]
    for i in range(layers):
        p = f"model.layers.{i}."
        params += [ParamInfo(p + "self_attn.q_proj.weight", (32, 32), "linear"),
                   ParamInfo(p + "self_attn.k_proj.weight", (16, 32), "linear"),
                   ParamInfo(p + "self_attn.v_proj.weight", (16, 32), "linear"),
                   ParamInfo(p + "self_attn.o_proj.weight", (32, 32), "linear"),
                   ParamInfo(p + "mlp.gate_proj.weight", (48, 32), "linear"),
                   ParamInfo(p + "mlp.up_proj.weight", (48, 32), "linear"),
                   ParamInfo(p + "mlp.down_proj.weight", (32, 48), "linear"),
                   ParamInfo(p + "input_layernorm.weight", (32,), "other")]
    params.append(ParamInfo("lm_head.weight", (64, 32), "linear", ("model.embed_tokens.weight",) if tied else ()))
    return params


def kinds(plan):
    return {name.split(".", 3)[-1] if name.startswith("model.layers") else name: p.kind for name, p in
            plan.params.items()}


def test_the_llama_preset_splits_attention_and_mlp_and_reports_what_no_rule_matched():
    plan = build_plan(llama_params(), dstp.preset_specs("llama", GQA), 2, GQA, source="preset llama")
    assert kinds(plan) == {"model.embed_tokens.weight": "replicated", "self_attn.q_proj.weight": "column",
                           "self_attn.k_proj.weight": "column", "self_attn.v_proj.weight": "column",
                           "self_attn.o_proj.weight": "row", "mlp.gate_proj.weight": "column",
                           "mlp.up_proj.weight": "column", "mlp.down_proj.weight": "row",
                           "input_layernorm.weight": "replicated", "lm_head.weight": "replicated"}
    assert plan.unmatched == ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "lm_head.weight"]
    k = plan.params["model.layers.0.self_attn.k_proj.weight"]
    assert (k.dim, k.parts, k.local_shape(2)) == (0, (16,), (8, 32))
    o = plan.params["model.layers.0.self_attn.o_proj.weight"]
    assert (o.dim, o.local_shape(2)) == (1, (32, 16))
    text = plan.format()
    assert "matched by no rule (kept whole): 3" in text and "lm_head.weight" in text


def test_bias_follows_its_weight():
    params = [ParamInfo("a.q_proj.weight", (8, 4), "linear"), ParamInfo("a.q_proj.bias", (8,), "linear"),
              ParamInfo("a.o_proj.weight", (4, 8), "linear"), ParamInfo("a.o_proj.bias", (4,), "linear")]
    specs = [LayerSpec((r".*q_proj\.weight$",), "column"), LayerSpec((r".*o_proj\.weight$",), "row")]
    plan = build_plan(params, specs, 2)
    assert plan.params["a.q_proj.bias"].kind == "column" and plan.params["a.q_proj.bias"].parts == (8,)
    assert plan.params["a.o_proj.bias"].kind == "replicated" and "after the all-reduce" in plan.params["a.o_proj.bias"].note


def test_the_models_base_model_tp_plan_is_used_when_no_preset_or_partition_config_is_given():
    geometry = ModelGeometry(model_type="custom", head_dim=8, num_attention_heads=4, num_key_value_heads=2,
                             base_model_tp_plan={"layers.*.self_attn.q_proj": "colwise",
                                                 "layers.*.self_attn.o_proj": "rowwise",
                                                 "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
                                                 "layers.*.mlp.experts": "moe_tp_experts",
                                                 "layers.*.self_attn.qkv_proj": "colwise_gather_output",
                                                 "layers.*.self_attn.dense": "rowwise_split_input"})
    specs, source, _ = resolve_specs(None, None, geometry)
    assert "base_model_tp_plan" in source
    params = [ParamInfo("model.layers.0.self_attn.q_proj.weight", (32, 32), "linear"),
              ParamInfo("model.layers.0.self_attn.o_proj.weight", (32, 32), "linear"),
              ParamInfo("model.layers.0.mlp.experts.gate_up_proj", (4, 96, 32), "other"),
              ParamInfo("model.layers.0.self_attn.qkv_proj.weight", (64, 32), "linear"),
              ParamInfo("model.layers.0.self_attn.dense.weight", (32, 32), "linear")]
    plan = build_plan(params, specs, 2, geometry, source=source)
    packed = plan.params["model.layers.0.mlp.experts.gate_up_proj"]
    assert (packed.kind, packed.dim, packed.parts, packed.local_shape(2)) == ("column", 1, (48, 48), (4, 48, 32))
    assert plan.params["model.layers.0.self_attn.qkv_proj.weight"].gather_output
    assert plan.params["model.layers.0.self_attn.dense.weight"].split_input


def test_partition_config_precedes_the_models_plan_and_merges_with_a_preset():
    geometry = ModelGeometry(model_type="llama", head_dim=8, num_attention_heads=4, num_key_value_heads=2,
                             base_model_tp_plan={"layers.*.self_attn.q_proj": "colwise"})
    import dsconfig

    def section(**partition):
        return dsconfig.load({"train_batch_size": 1, "tensor_parallel": {"autotp_size": 2, "partition_config":
                                                                          partition}}).tensor_parallel.partition_config

    custom = section(layer_specs=[{"patterns": [r".*\.q_proj\.weight$"], "partition_type": "skip"}])
    specs, source, _ = resolve_specs(None, custom, geometry)
    assert source == "partition_config" and len(specs) == 1
    specs, source, _ = resolve_specs("llama", custom, geometry)  # use_default_specs: custom first, then the preset
    assert source == "partition_config + preset llama" and specs[0].source.startswith("tensor_parallel.partition")
    plan = build_plan(llama_params(), specs, 2, GQA, source=source)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert plan.params[q].kind == "replicated" and len(plan.conflicts[q]) == 2  # reported: two rules matched
    assert "matched by two or more rules (the first applies): 1" in plan.format()
    only = section(use_default_specs=False, layer_specs=[{"patterns": [r".*\.o_proj\.weight$"],
                                                          "partition_type": "row"}])
    specs, source, notes = resolve_specs("llama", only, geometry)
    assert source == "partition_config" and len(specs) == 1 and "use_default_specs is false" in notes[0]


def test_model_types_limit_a_rule():
    spec = LayerSpec((r".*q_proj\.weight$",), "column", model_types=("qwen2",), required=True)
    plan = build_plan(llama_params(), [spec], 2, GQA)
    assert plan.params["model.layers.0.self_attn.q_proj.weight"].kind == "replicated"


def test_fused_weights_split_each_sub_parameter_so_ranks_keep_whole_heads():
    qkv = ParamInfo("m.self_attn.qkv_proj.weight", (64, 32), "linear")  # q 32 + k 16 + v 16 (GQA)
    unequal = LayerSpec((r".*qkv_proj\.weight$",), "column", shape=((32, 16, 16), -1), partition_dim=0)
    plan = build_plan([qkv], [unequal], 2, GQA)
    assert plan.params[qkv.name].parts == (32, 16, 16)
    full = torch.arange(64 * 2, dtype=torch.float64).reshape(64, 2)
    rank1 = dstp.shard_tensor(full, plan.params[qkv.name], 1, 2)
    assert torch.equal(rank1, torch.cat([full[16:32], full[40:48], full[56:64]]))
    assert torch.equal(dstp.merge_shards([dstp.shard_tensor(full, plan.params[qkv.name], r, 2) for r in range(2)],
                                         plan.params[qkv.name]), full)
    gate_up = ParamInfo("m.mlp.gate_up_proj.weight", (96, 32), "linear")
    equal = LayerSpec((r".*gate_up_proj\.weight$",), "column", shape=(2, -1), partition_dim=0)
    assert build_plan([gate_up], [equal], 2).params[gate_up.name].parts == (48, 48)
    experts = ParamInfo("m.w", (4 * 48, 32), "other")  # four experts stacked along dim 0, each split
    view = LayerSpec((r"m\.w$",), "column", shape=(4, -1, 32), partition_dim=1)
    assert build_plan([experts], [view], 2).params[experts.name].parts == (48, 48, 48, 48)


@pytest.mark.parametrize(("spec", "message"), [
    (dict(shape=(3, -1), partition_dim=0), "does not hold 3 equal sub-parameters"),
    (dict(shape=((32, 16), -1), partition_dim=0), "does not fit"),
    (dict(shape=(2, -1, -1), partition_dim=0), "at most one dimension may be -1"),
    (dict(shape=(2, (3, 4)), partition_dim=0), "allowed only at partition_dim"),
    (dict(shape=(2, -1), partition_dim=5), "out of range"),
    (dict(partition_dim=0), "only together with shape"),
])
def test_a_fused_shape_that_does_not_fit_is_refused_by_name(spec, message):
    qkv = ParamInfo("m.self_attn.qkv_proj.weight", (64, 32), "linear")
    with pytest.raises(TensorParallelError, match=message):
        build_plan([qkv], [LayerSpec((r".*qkv_proj\.weight$",), "column", source="layer_specs[0]", **spec)], 2, GQA)


def test_kv_heads_that_do_not_divide_are_refused_with_the_numbers():
    with pytest.raises(TensorParallelError) as caught:
        build_plan(llama_params(), dstp.preset_specs("llama", GQA), 4, GQA)
    text = str(caught.value)
    assert "k_proj" in text and "2 heads (num_key_value_heads" in text and "autotp_size 4" in text
    assert "valid for this model: 1, 2" in text


@pytest.mark.parametrize(("params", "specs", "tp", "message"), [
    (None, [LayerSpec((r".*nothing$",), "column", required=True, source="layer_specs[1]")], 2,
     "layer_specs\\[1\\].patterns: '.\\*nothing\\$' matches no parameter"),
    ([ParamInfo("norm.weight", (32,), "other")], [LayerSpec((r"norm",), "row")], 2, "row split cuts the input"),
    ([ParamInfo("mlp.up.weight", (30, 8), "linear")], [LayerSpec((r".*up",), "column")], 4,
     "do not split over autotp_size 4"),
    (None, [], 0, "autotp_size = 0"),
])
def test_refusals_name_the_rule_and_the_numbers(params, specs, tp, message):
    with pytest.raises(TensorParallelError, match=message):
        build_plan(params or llama_params(), specs, tp, GQA)


def test_bad_rules_are_refused_where_they_are_written():
    with pytest.raises(TensorParallelError, match="not a valid regular expression"):
        LayerSpec(("(",), "column", source="layer_specs[0]")
    with pytest.raises(TensorParallelError, match="partition_type = 'diagonal'"):
        LayerSpec(("x",), "diagonal")
    with pytest.raises(TensorParallelError, match="preset_model = 'gpt9'"):
        dstp.preset_specs("gpt9")
    with pytest.raises(TensorParallelError, match="no partition rules"):
        resolve_specs(None, None, ModelGeometry(model_type="custom"))
    with pytest.raises(TensorParallelError, match="local_rowwise"):
        resolve_specs(None, None, ModelGeometry(model_type="custom", base_model_tp_plan={"x": "local_rowwise"}))
    _, source, notes = resolve_specs(None, None, ModelGeometry(model_type="llama", base_model_tp_plan={"x": "odd"}))
    assert source.startswith("preset llama") and "cannot apply" in notes[0]


def test_vocab_parallel_head_splits_an_untied_head_and_keeps_a_tied_one_whole():
    plan = build_plan(llama_params(), [], 2, GQA, vocab_parallel_lm_head=True)
    assert plan.params["lm_head.weight"].kind == "vocab" and plan.params["lm_head.weight"].local_shape(2) == (32, 32)
    tied = build_plan(llama_params(tied=True), [], 2, GQA, vocab_parallel_lm_head=True)
    assert tied.params["lm_head.weight"].kind == "replicated" and "tied" in tied.notes[0]
    with pytest.raises(TensorParallelError, match="pad the vocabulary"):
        build_plan(llama_params(), [], 3, GQA, vocab_parallel_lm_head=True)
    with pytest.raises(TensorParallelError, match="needs a Linear output layer"):
        build_plan(llama_params()[:-1], [], 2, GQA, vocab_parallel_lm_head=True)
    with pytest.raises(TensorParallelError, match="tied to"):
        build_plan(llama_params(tied=True), [LayerSpec((r"lm_head",), "column")], 2, GQA)


def test_a_plan_round_trips_through_json_and_a_malformed_one_is_refused():
    plan = build_plan(llama_params(), dstp.preset_specs("llama", GQA), 2, GQA, source="preset llama")
    again = dstp.TensorParallelPlan.from_json(plan.to_json())
    assert again.params == plan.params and again.tp_size == 2
    broken = plan.to_json().replace('"parts": [32]', '"parts": [31]', 1)
    with pytest.raises(TensorParallelError, match="malformed"):
        dstp.TensorParallelPlan.from_json(broken)
    with pytest.raises(TensorParallelError, match="malformed"):
        dstp.TensorParallelPlan.from_json("[1, 2")


def test_a_config_with_unequal_fused_sub_parameters_plans_whole_gqa_heads():
    """DeepSpeed's GQA form "shape": [[q_size, kv_size, kv_size], -1] read through dsconfig's schema."""
    import dsconfig

    section = dsconfig.load({"train_batch_size": 1, "tensor_parallel": {"autotp_size": 2, "partition_config": {
        "layer_specs": [{"patterns": [r".*\.qkv_proj\.weight$"], "shape": [[32, 16, 16], -1],
                         "partition_dim": 0}]}}}).tensor_parallel
    specs = dstp.specs_from_config(section.partition_config)
    qkv = ParamInfo("m.self_attn.qkv_proj.weight", (64, 32), "linear")
    assert build_plan([qkv], specs, 2, GQA).params[qkv.name].parts == (32, 16, 16)
    with pytest.raises(TensorParallelError, match="2 heads"):  # 2 key/value heads do not split over 4
        build_plan([qkv], specs, 4, GQA)


def test_a_stage_plans_every_stages_parameters_and_placed_modules_stay_whole():
    """plan_for(params=...) plans what it is given (a pipeline's every stage), and a rule the user wrote is
    checked against all of them; keep_whole skips modules another parallelism places before any rule."""
    from torch import nn

    stage = nn.ModuleDict({"here": nn.ModuleDict({"mlp": nn.ModuleDict({"gate_proj": nn.Linear(32, 48, bias=False)})})})
    elsewhere = [ParamInfo("other.mlp.down_proj.weight", (32, 48), "linear")]
    mine = dstp.param_infos(stage)
    plan = dstp.plan_for(stage, 2, preset_model="llama", params=mine + elsewhere)
    assert {n: p.kind for n, p in plan.params.items()} == {"here.mlp.gate_proj.weight": "column",
                                                          "other.mlp.down_proj.weight": "row"}
    whole = dstp.plan_for(stage, 2, preset_model="llama", params=mine + elsewhere, keep_whole=["other.mlp", "mlp"],
                          keep_whole_why="placed by AutoEP")
    assert whole.params["other.mlp.down_proj.weight"].kind == "replicated"
    assert whole.params["other.mlp.down_proj.weight"].rule.startswith("skip") and "AutoEP" in whole.format()
    assert whole.params["here.mlp.gate_proj.weight"].kind == "column"  # module names from the start: "mlp" is not here


def test_the_models_own_tp_plan_merges_the_config_the_class_and_the_instance():
    """transformers keeps model-level entries (lm_head) on the model class and may replace the instance's plan with
    the base plan under a "model." prefix: the merge keeps each rule once and the class's lm_head entry."""

    class Config:
        base_model_tp_plan: ClassVar[dict] = {"layers.*.self_attn.q_proj": "colwise"}

    class Model:
        _tp_plan: ClassVar[dict | None] = {"lm_head": "colwise_gather_output"}

        def __init__(self, config, runtime):
            self.config = config
            if runtime is not None:
                self._tp_plan = runtime

    merged = dstp.hf_tp_plan(Model(Config(), {"model.layers.*.self_attn.q_proj": "colwise", "extra": "rowwise"}))
    assert merged == {"layers.*.self_attn.q_proj": "colwise", "lm_head": "colwise_gather_output", "extra": "rowwise"}
    assert dstp.hf_tp_plan(Model(None, None)) == {"lm_head": "colwise_gather_output"}
    assert dstp.hf_tp_plan(torch.nn.Linear(2, 2)) is None
    Config.base_model_tp_plan = {}
    Model._tp_plan = None
    assert dstp.hf_tp_plan(Model(Config(), {})) is None


def _hf_like(vocab: int, tied: bool, head_style: str = "colwise_gather_output"):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(8, 8)

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(vocab, 8)
            self.layers = torch.nn.ModuleList([Block()])

    class Config:
        model_type = "custom"
        base_model_tp_plan: ClassVar[dict] = {"layers.*.q_proj": "colwise"}

    class LM(torch.nn.Module):
        _tp_plan: ClassVar[dict] = {"lm_head": head_style}

        def __init__(self):
            super().__init__()
            self.config = Config()
            self.model = Inner()
            self.lm_head = torch.nn.Linear(8, vocab, bias=False)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

    return LM()


def test_a_model_level_entry_splits_the_head_only_where_it_can():
    """The class's lm_head entry splits an untied head that divides; a tied head, a vocabulary the degree does not
    divide or a style dstp does not apply keeps it whole (as without the entry), with a note saying why."""
    plan = dstp.plan_for(_hf_like(64, tied=False), 2)
    head = plan.params["lm_head.weight"]
    assert (head.kind, head.gather_output) == ("column", True) and plan.params["model.layers.0.q_proj.weight"].sharded
    for model, why in ((_hf_like(64, tied=True), "tied"), (_hf_like(63, tied=False), "does not divide"),
                       (_hf_like(64, tied=False, head_style="local_colwise"), "style")):
        plan = dstp.plan_for(model, 2)
        assert not plan.params["lm_head.weight"].sharded, plan.params["lm_head.weight"]
        assert any("'lm_head'" in note and why in note for note in plan.notes), plan.notes
        assert plan.params["model.layers.0.q_proj.weight"].sharded
    plan = dstp.plan_for(_hf_like(64, tied=False), 2, model_level_plan=False)  # the autotp pass: no gathered head
    assert not plan.params["lm_head.weight"].sharded and plan.params["model.layers.0.q_proj.weight"].sharded
