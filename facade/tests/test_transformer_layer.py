"""DeepSpeedTransformerLayer on the torch path: it equals a BERT layer written from torch.nn (outputs and
every gradient, pre- and post-LN, float64 tight and float32 1e-5, dropout off), takes DeepSpeed's state
dicts and initial weights, and refuses bad configs and inputs by name."""

import json

import pytest
import torch
from transformer_reference import ReferenceBertLayer

import dstrain
from dstrain.ops.transformer import (
    SPARSE_ATTENTION_NOTE,
    DeepSpeedTransformerConfig,
    DeepSpeedTransformerLayer,
    refuse_sparse_attention,
)

HIDDEN, HEADS, INTER, BATCH, SEQ = 32, 4, 64, 3, 10
NAMES = ["attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb", "inter_w", "inter_b", "output_w",
         "output_b", "norm_w", "norm_b"]
TOLERANCE = {torch.float64: {"rtol": 1e-10, "atol": 1e-10}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}


def config(**overrides) -> DeepSpeedTransformerConfig:
    args = dict(batch_size=BATCH, hidden_size=HIDDEN, intermediate_size=INTER, heads=HEADS, attn_dropout_ratio=0.0,
                hidden_dropout_ratio=0.0, num_hidden_layers=2, initializer_range=0.02, pre_layer_norm=True)
    return DeepSpeedTransformerConfig(**{**args, **overrides})


def bert_mask(dtype) -> torch.Tensor:
    mask = torch.zeros(BATCH, 1, 1, SEQ, dtype=dtype)
    mask[1, ..., 7:] = -10000.0  # the second sequence is 7 tokens of padding-free text
    mask[2, ..., 4:] = -10000.0
    return mask


def matched_pair(dtype, pre_layer_norm: bool, **overrides):
    generator = torch.Generator().manual_seed(1)
    reference = ReferenceBertLayer(HIDDEN, HEADS, INTER, pre_layer_norm).to(dtype)
    reference.randomize(generator)
    layer = DeepSpeedTransformerLayer(config(pre_layer_norm=pre_layer_norm, **overrides)).to(dtype)
    layer.load_state_dict({name: t.detach().clone() for name, t in reference.deepspeed_view().items()})
    return reference, layer, generator


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre_ln", "post_ln"])
def test_outputs_and_every_gradient_equal_the_torch_nn_reference(dtype, pre_layer_norm):
    reference, layer, generator = matched_pair(dtype, pre_layer_norm)
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=generator, dtype=dtype)
    grad_out = torch.randn(BATCH, SEQ, HIDDEN, generator=generator, dtype=dtype)
    x_ref, x_ds = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_ds = reference(x_ref, bert_mask(dtype)), layer(x_ds, bert_mask(dtype))
    out_ref.backward(grad_out)
    out_ds.backward(grad_out)

    torch.testing.assert_close(out_ds, out_ref, **TOLERANCE[dtype])
    torch.testing.assert_close(x_ds.grad, x_ref.grad, **TOLERANCE[dtype])
    expected = reference.deepspeed_grads()
    for name, param in layer.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], **TOLERANCE[dtype], msg=lambda m, n=name: f"{n}: {m}")


def test_eval_mode_turns_dropout_off_and_matches_the_reference():
    reference, layer, generator = matched_pair(torch.float64, True, attn_dropout_ratio=0.3, hidden_dropout_ratio=0.3)
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=generator, dtype=torch.float64)
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x, bert_mask(torch.float64)), reference.eval()(x, bert_mask(torch.float64)))
    assert layer.config.training is False and layer.config.is_grad_enabled is False  # as DeepSpeed records them
    layer.train()
    with torch.no_grad():
        assert not torch.allclose(layer(x), reference(x))  # training: dropout at 0.3 changes the output


def test_no_mask_and_broadcast_masks_agree():
    _, layer, generator = matched_pair(torch.float64, True)
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=generator, dtype=torch.float64)
    zeros = torch.zeros(1, 1, 1, SEQ, dtype=torch.float64)  # one mask for the whole batch
    torch.testing.assert_close(layer(x), layer(x, zeros), rtol=0, atol=0)
    torch.testing.assert_close(layer(x, bert_mask(torch.float64)), layer(x, bert_mask(torch.float64).view(BATCH, SEQ)))


def test_parameter_names_and_shapes_are_deepspeeds():
    layer = DeepSpeedTransformerLayer(config())
    assert [(n, tuple(p.shape)) for n, p in layer.named_parameters()] == [
        ("attn_qkvw", (3 * HIDDEN, HIDDEN)), ("attn_qkvb", (3 * HIDDEN,)), ("attn_ow", (HIDDEN, HIDDEN)),
        ("attn_ob", (HIDDEN,)), ("attn_nw", (HIDDEN,)), ("attn_nb", (HIDDEN,)), ("inter_w", (INTER, HIDDEN)),
        ("inter_b", (INTER,)), ("output_w", (HIDDEN, INTER)), ("output_b", (HIDDEN,)), ("norm_w", (HIDDEN,)),
        ("norm_b", (HIDDEN,))]


def test_bert_init_with_the_adjusted_output_range():
    torch.manual_seed(0)
    layer = DeepSpeedTransformerLayer(config(hidden_size=256, heads=4, intermediate_size=1024, num_hidden_layers=8))
    assert layer.attn_qkvw.std().item() == pytest.approx(0.02, rel=0.02)
    assert layer.attn_ow.std().item() == pytest.approx(0.02 / 4, rel=0.05)  # 0.02 / sqrt(2 * 8)
    assert layer.output_w.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert torch.equal(layer.norm_w, torch.ones(256)) and torch.equal(layer.attn_qkvb, torch.zeros(768))
    plain = DeepSpeedTransformerLayer(config(hidden_size=256, heads=4, intermediate_size=1024, adjust_init_range=False))
    assert plain.attn_ow.std().item() == pytest.approx(0.02, rel=0.05)


def test_a_deepspeed_layout_state_dict_round_trips_through_a_file(tmp_path):
    """A model of layers in a ModuleList, as the tutorial builds one: its state dict (DeepSpeed's keys)
    saved, loaded into a fresh model, gives the same outputs."""
    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.ModuleList([DeepSpeedTransformerLayer(config(initializer_range=0.5)) for _ in range(2)])

    def run(layers, x):
        for layer in layers:
            x = layer(x, bert_mask(torch.float32))
        return x

    source, target = model(0), model(1)
    keys = list(source.state_dict())
    assert keys == [f"{i}.{name}" for i in range(2) for name in NAMES]
    torch.save(source.state_dict(), tmp_path / "layers.pt")
    target.load_state_dict(torch.load(tmp_path / "layers.pt", weights_only=True))
    x = torch.randn(BATCH, SEQ, HIDDEN)
    torch.testing.assert_close(run(target, x), run(source, x), rtol=0, atol=0)


def test_deepspeed_initial_weights_and_biases_lists():
    reference, _, generator = matched_pair(torch.float32, True)
    weights = [reference.query.weight, reference.key.weight, reference.value.weight, reference.attn_out.weight,
               reference.attn_norm.weight, reference.intermediate.weight, reference.output.weight, reference.norm.weight]
    biases = [reference.query.bias, reference.key.bias, reference.value.bias, reference.attn_out.bias,
              reference.attn_norm.bias, reference.intermediate.bias, reference.output.bias, reference.norm.bias]
    layer = DeepSpeedTransformerLayer(config(initializer_range=-1), weights, biases)  # no init needed
    assert layer.attn_ow is reference.attn_out.weight  # DeepSpeed takes the very Parameters over
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=generator)
    torch.testing.assert_close(layer(x, bert_mask(torch.float32)), reference(x, bert_mask(torch.float32)),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(dstrain.DstrainError, match=r"initial_weights\[5\] \(inter_w\) has shape \(64, 31\)"):
        DeepSpeedTransformerLayer(config(), [*weights[:5], torch.zeros(INTER, HIDDEN - 1), *weights[6:]], biases)
    with pytest.raises(dstrain.DstrainError, match="initial_biases has 7 tensors"):
        DeepSpeedTransformerLayer(config(), weights, biases[:7])


def test_return_tuple_and_the_layer_id_counter():
    first = DeepSpeedTransformerLayer(config(return_tuple=True))
    second = DeepSpeedTransformerLayer(config())
    assert second.layer_id == first.layer_id + 1 == DeepSpeedTransformerLayer.layer_id - 1  # the next id
    out = first(torch.randn(2, 5, HIDDEN))
    assert isinstance(out, tuple) and out[0].shape == (2, 5, HIDDEN)


def test_bad_config_values_are_refused_naming_each_argument():
    with pytest.raises(dstrain.ConfigError) as err:
        DeepSpeedTransformerConfig(hidden_size=100, heads=16, attn_dropout_ratio=1.0, hidden_dropout_ratio=-0.1,
                                   layer_norm_eps=0, pre_layer_norm="yes", initializer_range=-0.5)
    text = str(err.value)
    assert err.value.paths == ["heads", "attn_dropout_ratio", "hidden_dropout_ratio", "initializer_range",
                               "layer_norm_eps", "pre_layer_norm"]
    assert "must divide hidden_size 100" in text and "[1, 2, 4, 5, 10, 20, 25, 50]" in text
    assert "in [0, 1)" in text and "DeepSpeedTransformerConfig" in text
    with pytest.raises(dstrain.ConfigError, match="hidden_size = 0: must be a positive int"):
        DeepSpeedTransformerConfig(hidden_size=0)


def test_defaults_are_deepspeeds_and_a_layer_needs_its_sizes_set():
    default = DeepSpeedTransformerConfig()  # DeepSpeed builds these with everything unset
    assert (default.layer_norm_eps, default.pre_layer_norm, default.adjust_init_range, default.seed,
            default.intermediate_size) == (1e-12, True, True, -1, -4)
    with pytest.raises(dstrain.ConfigError) as err:
        DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(hidden_size=64, attn_dropout_ratio=0.1))
    assert err.value.paths == ["heads", "hidden_dropout_ratio", "initializer_range", "num_hidden_layers"]
    unset_later = DeepSpeedTransformerConfig()
    unset_later.hidden_size, unset_later.heads = 64, 3  # set by attribute, as from_dict does in DeepSpeed
    with pytest.raises(dstrain.ConfigError, match="heads = 3: must divide hidden_size 64"):
        DeepSpeedTransformerLayer(unset_later)


def test_from_dict_and_from_json_file(tmp_path):
    values = {"hidden_size": 64, "heads": 4, "attn_dropout_ratio": 0.1, "hidden_dropout_ratio": 0.1,
              "initializer_range": 0.02, "num_hidden_layers": 2, "layer_id": 7}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values), encoding="utf-16")  # DeepSpeed reads its files as UTF-16
    loaded = DeepSpeedTransformerConfig.from_json_file(path)
    assert (loaded.hidden_size, loaded.intermediate_size, loaded.layer_id) == (64, 256, 7)
    with pytest.raises(dstrain.ConfigError, match="hiden_size: not an argument of DeepSpeedTransformerConfig"):
        DeepSpeedTransformerConfig.from_dict({"hiden_size": 64})


def test_bad_inputs_are_refused_with_what_would_be_valid():
    layer = DeepSpeedTransformerLayer(config())
    x = torch.randn(2, 5, HIDDEN)
    with pytest.raises(dstrain.DstrainError, match=r"hidden_states has shape \(2, 5, 16\); expected \[batch, seq, 32\]"):
        layer(torch.randn(2, 5, 16))
    with pytest.raises(dstrain.DstrainError, match=r"hidden_states is torch\.float64 but the parameters are torch\.float32"):
        layer(x.double())
    with pytest.raises(dstrain.DstrainError, match=r"attention_mask has shape \(2, 1, 5, 5\)"):
        layer(x, torch.zeros(2, 1, 5, 5))
    with pytest.raises(dstrain.DstrainError, match=r"attention_mask is torch\.bool; it is BERT's additive float mask"):
        layer(x, torch.ones(2, 1, 1, 5, dtype=torch.bool))
    with pytest.raises(dstrain.DstrainError, match="head_mask is not supported"):
        layer(x, head_mask=torch.ones(HEADS))
    with pytest.raises(dstrain.DstrainError, match="output_attentions=True is not supported"):
        layer(x, output_attentions=True)


def test_sparse_attention_beside_the_kernel_is_refused_with_the_tutorials_note():
    refuse_sparse_attention({"train_batch_size": 8})  # no sparse attention: fine
    with pytest.raises(dstrain.ConfigError) as err:
        refuse_sparse_attention({"sparse_attention": {"mode": "fixed"}}, source="ds_config.json")
    assert err.value.paths == ["sparse_attention"] and SPARSE_ATTENTION_NOTE in str(err.value)
    assert "does not support sparse attention" in SPARSE_ATTENTION_NOTE


def test_the_deepspeed_module_path_resolves():
    import dstrain.as_deepspeed as as_deepspeed
    assert as_deepspeed.MAPPED_PATHS["deepspeed.ops.transformer"] == "dstrain.ops.transformer"


def test_the_kernel_choice_is_checked(monkeypatch):
    from dstrain.ops.kernels import backend_name, triton_available
    layer = DeepSpeedTransformerLayer(config())
    x = torch.randn(2, 5, HIDDEN)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("DSTRAIN_KERNELS", "cuda")
    with pytest.raises(dstrain.DstrainError, match="DSTRAIN_KERNELS='cuda' is not a kernel choice; valid: auto, "
                                                   "torch, triton"):
        layer(x)
    monkeypatch.setenv("DSTRAIN_KERNELS", "triton")
    expected = "needs a CUDA tensor" if triton_available() else r"pip install 'dstrain\[kernels\]'"
    with pytest.raises(dstrain.DstrainError, match=expected):
        layer(x)
    assert backend_name(x.double()) == "torch"  # float64 stays on the exact path whatever is asked
    monkeypatch.setenv("DSTRAIN_KERNELS", "auto")
    assert backend_name(x) == "torch"  # a CPU tensor without the interpreter
