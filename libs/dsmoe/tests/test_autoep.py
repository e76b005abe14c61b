"""AutoEP at autoep_size 1 on tiny Hugging Face models: the swapped model's loss, router logits, aux
loss and gradients equal the original's (Mixtral, Qwen3-MoE, Qwen-MoE with a shared expert and its
gate, DeepSeek-V3 with group-limited sigmoid routing and a non-zero correction bias held as a buffer);
every expert backend equals the per-expert loop; every constraint of the reference is refused naming
its key; custom models through the patterns, both fused layouts and separate w3.
"""

import copy

import autoep_models as M
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dsconfig
from dsconfig import ExpertParallelConfig
from dsmoe import MoEError, autoep

pytest.importorskip("transformers")

RTOL = 1e-5


def _ep(**keys):
    return ExpertParallelConfig(enabled=True, **keys)


def _run(model, seed=3):
    model.zero_grad(set_to_none=True)
    out = model(**M.batch(seed))
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("kind", list(M.BUILDERS))
@pytest.mark.parametrize("backend", ["loop", "grouped_mm"])
def test_swapped_model_equals_original(kind, backend):
    reference = M.build(kind)
    swapped = copy.deepcopy(reference)
    replaced = autoep.apply(swapped, _ep(), backend=backend)
    assert replaced and all(isinstance(swapped.get_submodule(n), autoep.AutoEPLayer) for n in replaced)
    assert not any(isinstance(m, type(reference.get_submodule(replaced[0]))) for m in swapped.modules())
    expected, expected_grads = _run(reference)
    got, got_grads = _run(swapped)
    torch.testing.assert_close(got.loss, expected.loss, rtol=RTOL, atol=1e-6)
    assert len(got.router_logits) == len(expected.router_logits) == len(replaced)
    for a, b in zip(got.router_logits, expected.router_logits):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-6)
    if expected.aux_loss is not None:
        torch.testing.assert_close(got.aux_loss, expected.aux_loss, rtol=RTOL, atol=1e-6)
    assert set(got_grads) == set(expected_grads)  # same names: the state dict is the model's own
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    reloaded = M.BUILDERS[kind]()
    reloaded.load_state_dict(swapped.state_dict())  # strict: loads back into the HF class


def test_deepseek_correction_bias_is_used_for_the_choice():
    """The parity above holds only with the bias: without it DeepSeek-V3 picks other experts (so a
    swap that dropped the buffer, as copying only parameters does, fails that test)."""
    reference = M.build("deepseek_v3")
    swapped = copy.deepcopy(reference)
    autoep.apply(swapped, _ep())
    layer = swapped.get_submodule("model.layers.1.mlp")
    assert layer.names.correction_bias == "e_score_correction_bias"
    bias = layer.router_module.e_score_correction_bias
    assert bias.abs().sum() > 0 and "model.layers.1.mlp.gate.e_score_correction_bias" in swapped.state_dict()
    expected = reference(**M.batch(3)).loss
    with torch.no_grad():
        bias.zero_()
    assert not torch.allclose(swapped(**M.batch(3)).loss, expected, rtol=RTOL)


def test_routing_settings_are_read_from_each_model():
    spec = lambda model, name: model.get_submodule(name).spec  # noqa: E731
    mixtral, qwen, deepseek = M.build("mixtral"), M.build("qwen2_moe_shared"), M.build("deepseek_v3")
    for model in (mixtral, qwen, deepseek):
        autoep.apply(model, _ep())
    assert (spec(mixtral, "model.layers.0.mlp").route_norm, spec(qwen, "model.layers.0.mlp").route_norm) == (True, False)
    ds = spec(deepseek, "model.layers.1.mlp")
    assert (ds.score_func, ds.num_groups, ds.limited_groups, ds.group_score, ds.scale) == ("sigmoid", 4, 2, "top2_sum", 2.5)
    qwen_layer = qwen.get_submodule("model.layers.0.mlp")
    assert (qwen_layer.names.shared_experts, qwen_layer.names.shared_experts_gate) == ("shared_expert",
                                                                                       "shared_expert_gate")
    # explicit keys override the model: route_scale multiplies routed_scaling_factor, top_k an int
    model = M.build("deepseek_v3")
    autoep.apply(model, _ep(route_scale=2.0, routed_scaling_factor=1.5, top_k=3, route_norm=False, score_func="softmax",
                            num_expert_groups=2, num_limited_groups=1))
    ds = spec(model, "model.layers.1.mlp")
    assert (ds.scale, ds.top_k, ds.route_norm, ds.score_func, ds.num_groups, ds.limited_groups) == (
        3.0, 3, False, "softmax", 2, 1)
    # named shared experts and gate; a named child the block lacks is refused by its key
    named = M.build("qwen2_moe_shared")
    autoep.apply(named, _ep(has_shared_experts=True, shared_experts_pattern="shared_expert",
                            shared_experts_gate_pattern="shared_expert_gate"))
    torch.testing.assert_close(named(**M.batch(3)).loss, M.build("qwen2_moe_shared")(**M.batch(3)).loss, rtol=RTOL,
                               atol=1e-6)
    _refused("qwen2_moe_shared", r"expert_parallel\.shared_experts_gate_pattern: .* no child 'no_such_gate'",
             shared_experts_gate_pattern="no_such_gate")
    _refused("qwen2_moe_shared", r"expert_parallel\.shared_experts_pattern: .* no child 'no_such'",
             shared_experts_pattern="no_such")
    # has_shared_experts false: the swapped layer computes the routed experts only
    ungated = M.build("qwen2_moe_shared")
    autoep.apply(ungated, _ep(has_shared_experts=False))
    assert ungated.get_submodule("model.layers.0.mlp").names.shared_experts is None


# ------------------------------------------------------------------------------------------ backends
@pytest.mark.parametrize("in_out", [False, True])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("backend", ["grouped_mm"])
def test_backends_equal_the_loop(backend, fused, in_out):
    torch.manual_seed(0)
    experts, hidden, ffn = 4, 16, 8
    sizes = [5, 0, 9, 2]  # an expert with no rows too

    def weight(out, inp):
        return torch.randn((experts, inp, out) if in_out else (experts, out, inp), requires_grad=True)

    w1 = weight(2 * ffn if fused else ffn, hidden)
    w3 = None if fused else weight(ffn, hidden)
    w2 = weight(hidden, ffn)
    x = torch.randn(sum(sizes), hidden, requires_grad=True)
    params = [x, w1, w2] + ([w3] if w3 is not None else [])
    results = {}
    for name in ("loop", backend):
        y = autoep.expert_mlp(x, sizes, w1, w2, w3, in_out, F.silu, name)
        y.sum().backward()  # a stride-0 incoming gradient: _grouped_mm needs it made contiguous
        results[name] = (y.detach(), [p.grad.clone() for p in params])
        for p in params:
            p.grad = None
    torch.testing.assert_close(results[backend][0], results["loop"][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(results[backend][1], results["loop"][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_backend_choice_follows_the_config():
    for keys, want in (({}, "grouped_mm"), ({"use_grouped_mm": False}, "loop"),
                       ({"disable_triton_grouped_mm": True}, "grouped_mm")):
        model = M.build("mixtral")
        autoep.apply(model, _ep(**keys))
        assert {layer.backend for _, layer in autoep.autoep_layers(model)} == {want}, keys
    cpu, f32 = torch.device("cpu"), torch.float32
    assert autoep.choose_backend(False, False, cpu, f32, [16, 32]) == "loop"
    assert autoep.choose_backend(True, False, cpu, f32, [16, 32]) == "grouped_mm"
    assert autoep.choose_backend(True, False, cpu, torch.float64, [16, 32]) == "loop"  # _grouped_mm has no fp64
    assert autoep.choose_backend(True, False, cpu, f32, [16, 30]) == "loop"  # rows not 16-byte aligned
    with pytest.raises(MoEError, match="'cuda'"):
        autoep.choose_backend(True, False, cpu, f32, [16], requested="cuda")


# ------------------------------------------------------------------------------------------ refusals
def _refused(kind, match, **keys):
    model = M.build(kind)
    with pytest.raises(MoEError, match=match):
        autoep.apply(model, _ep(**keys))
    return model


def test_constraints_are_refused_naming_the_key():
    _refused("mixtral", r"expert_parallel\.autoep_size: 3 does not divide the 4 experts", autoep_size=3)
    _refused("mixtral", r"expert_parallel\.autoep_size is 2 but no expert-parallel group", autoep_size=2)
    _refused("mixtral", r"expert_parallel\.top_k: 5 experts per token but .* 4 experts", top_k=5)
    _refused("mixtral", r"expert_parallel\.num_experts_attr: .* shape \(4, 16\) but model\.config\.num_hidden_layers",
             num_experts_attr="num_hidden_layers")
    _refused("mixtral", r"expert_parallel\.top_k_attr: model\.config\.nope is None", top_k_attr="nope")
    _refused("mixtral", r"expert_parallel\.expert_w1: .*experts\.w1 must be a 3-D tensor", expert_w1="w1")
    _refused("mixtral", r"expert_parallel\.expert_w1: .* fit neither", expert_w3="down_proj")
    _refused("mixtral", r"expert_parallel\.expert_tensor_parallel_size is 2", expert_tensor_parallel_size=2)
    _refused("mixtral", r"expert_parallel\.load_balance_coeff must be null", load_balance_coeff=0.01)
    with pytest.raises(dsconfig.ConfigError, match=r"expert_parallel\.load_balance_coeff = 0\.01: must be null"):
        dsconfig.load({"train_batch_size": 1, "expert_parallel": {"enabled": True, "load_balance_coeff": 0.01}})
    _refused("mixtral", r"expert_parallel\.async_split_plan: the CUDA side-stream", async_split_plan=True,
             autoep_size=2)
    _refused("mixtral", r"expert_parallel\.combine_impl: \"fused_weighted_sum\" needs CUDA",
             combine_impl="fused_weighted_sum")
    _refused("mixtral", r"expert_parallel\.shared_experts_pattern: has_shared_experts is true but .* no child "
                        r"'shared'", has_shared_experts=True, shared_experts_pattern="shared")
    _refused("mixtral", r"expert_parallel: no module matches moe_layer_pattern", preset_model="mixtral",
             moe_layer_pattern=r"model\.layers\.\d+\.moe")
    _refused("deepseek_v3", r"expert_parallel\.num_limited_groups: 5 must be <= expert_parallel\.num_expert_groups "
                            r"\(4\)", num_limited_groups=5)
    _refused("deepseek_v3", r"expert_parallel\.num_expert_groups: 3 groups do not divide the 8 experts",
             num_expert_groups=3)
    _refused("deepseek_v3", r"expert_parallel\.num_limited_groups: 1 group\(s\) of 2 experts hold fewer than top_k 3",
             num_limited_groups=1, top_k=3)
    _refused("mixtral", r"expert_parallel\.num_limited_groups needs expert_parallel\.num_expert_groups",
             num_limited_groups=1)
    model = M.build("mixtral")  # nothing was swapped by a refused apply
    assert not autoep.autoep_layers(model)


def test_preset_choice():
    # a model type without a preset: every preset looks; DeepSeek-V3's blocks (their router holds a
    # correction bias) are recognised by deepseek_v3 only
    model = M.build("deepseek_v3")
    model.config.model_type = "my_deepseek"
    autoep.apply(model, _ep())
    assert autoep.autoep_layers(model)[0][1].spec.score_func == "sigmoid"
    # Mixtral/Qwen-style blocks are claimed by several presets: the error says to pick one
    model = M.build("qwen3_moe")
    model.config.model_type = "my_qwen"
    with pytest.raises(MoEError, match=r"expert_parallel\.preset_model: .*'qwen3_moe', 'qwen3_5_moe'\] all claim"):
        autoep.apply(model, _ep())
    autoep.apply(model, _ep(preset_model="qwen3_moe"))
    assert len(autoep.autoep_layers(model)) == 2
    # an explicit preset wins over model_type, and the custom path over both
    model = M.build("mixtral")
    with pytest.raises(MoEError, match="no module matches"):
        autoep.apply(model, _ep(moe_layer_pattern=r"model\.layers\.0\.nothing"))
    autoep.apply(model, _ep(moe_layer_pattern=r"model\.layers\.0\.mlp"))
    assert [n for n, _ in autoep.autoep_layers(model)] == ["model.layers.0.mlp"]


def test_disabled_config_changes_nothing():
    model = M.build("mixtral")
    assert autoep.apply(model, ExpertParallelConfig(enabled=False, autoep_size=3)) == []
    assert not autoep.autoep_layers(model)


# ------------------------------------------------------------------------------------------ custom models
class _Experts(nn.Module):
    def __init__(self, experts, hidden, ffn, layout):
        super().__init__()
        self.layout = layout
        if layout == "separate":
            self.w1 = nn.Parameter(torch.randn(experts, hidden, ffn) * 0.3)
            self.w3 = nn.Parameter(torch.randn(experts, hidden, ffn) * 0.3)
        elif layout == "fused_in_out":
            self.w1 = nn.Parameter(torch.randn(experts, hidden, 2 * ffn) * 0.3)
        else:
            self.w1 = nn.Parameter(torch.randn(experts, 2 * ffn, hidden) * 0.3)
        in_out = layout != "fused_out_in"
        self.w2 = nn.Parameter(torch.randn((experts, ffn, hidden) if in_out else (experts, hidden, ffn)) * 0.3)

    def expert(self, e, x):
        if self.layout == "separate":
            return (F.silu(x @ self.w1[e]) * (x @ self.w3[e])) @ self.w2[e]
        if self.layout == "fused_in_out":
            gate, up = (x @ self.w1[e]).chunk(2, dim=-1)
            return (F.silu(gate) * up) @ self.w2[e]
        gate, up = (x @ self.w1[e].t()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.w2[e].t()


class _Block(nn.Module):
    """A non-HF MoE block: softmax top-2 routing without renormalisation, scores applied `apply`."""

    def __init__(self, experts=4, hidden=16, ffn=8, layout="separate", apply="post"):
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.mlp_experts = _Experts(experts, hidden, ffn, layout)
        self.apply_scores = apply

    def forward(self, x):
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, idx = probs.topk(2, dim=-1)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(2):
                e, w = int(idx[t, k]), weights[t, k]
                out[t] += self.mlp_experts.expert(e, x[t] * w) if self.apply_scores == "pre" else \
                    w * self.mlp_experts.expert(e, x[t])
        return out


class _Model(nn.Module):
    def __init__(self, **block):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({"moe": _Block(**block)}) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["moe"](x)
        return x


class _Cfg:
    num_moe_experts, moe_top_k = 4, 2


@pytest.mark.parametrize("layout,w3,apply", [("separate", "w3", "post"), ("fused_in_out", None, "post"),
                                             ("fused_out_in", None, "post"), ("separate", "w3", "pre")])
def test_custom_model_through_the_patterns(layout, w3, apply):
    torch.manual_seed(1)
    reference = _Model(layout=layout, apply=apply)
    swapped = copy.deepcopy(reference)
    cfg = _ep(moe_layer_pattern=r"layers\.\d+\.moe", router_pattern="router", expert_pattern="mlp_experts",
              expert_w1="w1", expert_w2="w2", expert_w3=w3, num_experts_attr="num_moe_experts", top_k_attr="moe_top_k",
              has_shared_experts=False, score_apply=apply)
    assert autoep.apply(swapped, cfg, model_config=_Cfg()) == ["layers.0.moe", "layers.1.moe"]
    assert swapped.layers[0]["moe"].local_experts.in_out is (layout != "fused_out_in")
    x = torch.randn(10, 16)
    torch.testing.assert_close(swapped(x), reference(x), rtol=1e-5, atol=1e-5)
    legacy = copy.deepcopy(reference)
    autoep.apply(legacy, cfg.__class__(**{**_asdict(cfg), "combine_impl": "legacy_bmm"}), model_config=_Cfg())
    torch.testing.assert_close(legacy(x), reference(x), rtol=1e-5, atol=1e-5)


def _asdict(cfg):
    import attrs
    return attrs.asdict(cfg, recurse=False)


def test_a_missing_backend_is_refused_naming_the_key(monkeypatch):
    from dsmoe.autoep import grouped

    cpu, f32 = torch.device("cpu"), torch.float32
    monkeypatch.setattr(grouped, "triton_available", lambda: False)  # as on a machine without triton
    with pytest.raises(MoEError, match=r"needs the triton package.*expert_parallel\.disable_triton_grouped_mm"):
        autoep.choose_backend(True, False, cpu, f32, [16], requested="triton")
    monkeypatch.setattr(grouped, "grouped_mm_available", lambda: False)  # and a torch without _grouped_mm
    with pytest.raises(MoEError, match=r"expert_parallel\.use_grouped_mm is true but neither"):
        autoep.choose_backend(True, False, cpu, f32, [16])
    assert autoep.choose_backend(False, False, cpu, f32, [16]) == "loop"


def test_mixtral_router_jitter_is_kept():
    reference = M.build("mixtral")
    for layer in reference.model.layers:
        layer.mlp.jitter_noise = 0.2
    swapped = copy.deepcopy(reference)
    autoep.apply(swapped, _ep())
    assert swapped.model.layers[0].mlp.jitter_noise == 0.2
    losses = []
    for model in (reference, swapped):
        torch.manual_seed(11)  # the same noise draws in the same order
        losses.append(model(**M.batch(3)).loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=RTOL, atol=1e-6)
    swapped.eval()
    reference.eval()
    torch.testing.assert_close(swapped(**M.batch(3)).loss, reference(**M.batch(3)).loss, rtol=RTOL, atol=1e-6)


def test_grouped_mm_layer_cast_to_a_dtype_it_cannot_take_runs_the_loop():
    """Chosen at float32 (12 x 4 bytes aligned), then cast to bfloat16 (12 x 2 bytes is not): the
    layer falls back to the loop for that call instead of failing inside _grouped_mm."""
    torch.manual_seed(1)
    reference = _Model(hidden=12, ffn=4, layout="fused_out_in")
    swapped = copy.deepcopy(reference)
    autoep.apply(swapped, _ep(moe_layer_pattern=r"layers\.\d+\.moe", router_pattern="router",
                              expert_pattern="mlp_experts", expert_w1="w1", expert_w2="w2", expert_w3=None,
                              num_experts_attr="num_moe_experts", top_k_attr="moe_top_k"), model_config=_Cfg())
    assert swapped.layers[0]["moe"].backend == "grouped_mm"
    x = torch.randn(10, 12).bfloat16()
    swapped.to(torch.bfloat16)
    loop = copy.deepcopy(swapped)
    for layer in loop.layers:
        layer["moe"].backend = "loop"
    torch.testing.assert_close(swapped(x), loop(x), rtol=0, atol=0)
