"""random-LTD: the layer on a kept subset equals running it on that subset by hand (outputs and
gradients, float64), dropped tokens pass bit-exactly, masks follow, layers are matched by index, and the
reserved-length schedule, accounting and state."""

import pytest
import torch
from torch import nn

from dsdata import (
    DataEfficiencyError,
    RandomLayerTokenDrop,
    RandomLTDScheduler,
    configure_random_ltd,
    convert_to_random_ltd,
    effective_seq_length,
    random_ltd_layers,
    remove_random_ltd_state_dict,
    save_without_random_ltd,
)
from dsdata.random_ltd import gather_encoder_mask, sample_token_indices


class Block(nn.Module):
    """Attention with an additive mask, then an MLP: every kept token's output depends on the other kept ones."""

    def __init__(self, d=8, batch_first=True):
        super().__init__()
        self.qkv, self.out, self.mlp = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, d)
        self.batch_first = batch_first

    def forward(self, x, attention_mask=None):
        if not self.batch_first:
            x = x.transpose(0, 1)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 8 ** 0.5
        if attention_mask is not None:
            scores = scores + attention_mask.squeeze(1)
        y = x + self.out(scores.softmax(-1) @ v)
        y = y + torch.tanh(self.mlp(y))
        return (y if self.batch_first else y.transpose(0, 1)), "extra"


class Model(nn.Module):
    def __init__(self, layers=4, batch_first=True):
        super().__init__()
        self.blocks = nn.ModuleList(Block(batch_first=batch_first) for _ in range(layers))

    def forward(self, x, mask=None):
        for block in self.blocks:
            x = block(x, attention_mask=mask)[0]
        return x


def ltd_config(layer_ids, total=4, order="batch_seq_dim", model_type="decoder", min_value=6, max_value=12):
    return {"enabled": True, "total_layer_num": total, "random_ltd_layer_num": len(layer_ids),
            "random_ltd_layer_id": layer_ids, "model_mask_name": "attention_mask", "model_type": model_type,
            "hidden_state_order": order, "random_ltd_schedule": {
                "min_value": min_value, "max_value": max_value, "schedule_type": "fixed_linear",
                "schedule_config": {"require_steps": 10, "seq_per_step": 2}}}


def causal(seq):
    return torch.full((seq, seq), float("-inf"), dtype=torch.float64).triu(1).reshape(1, 1, seq, seq)


def reference(block, x, kept, mask, model_type):
    """The block on each sample's kept tokens, by hand, written back into a copy of x."""
    out = x.clone()
    for b in range(x.shape[0]):
        rows = kept[b]
        if mask is None:
            sub_mask = None
        elif model_type == "decoder":
            sub_mask = mask[:, :, :len(rows), :len(rows)]
        else:
            sub_mask = mask[b:b + 1][:, :, rows][:, :, :, rows]
        out[b, rows] = block(x[b:b + 1, rows], attention_mask=sub_mask)[0][0]
    return out


@pytest.mark.parametrize("model_type", ["decoder", "encoder"])
def test_outputs_and_gradients_equal_the_layer_on_the_subset_by_hand(model_type):
    torch.manual_seed(0)
    model = Model().double()
    convert_to_random_ltd(model, Block)
    scheduler = RandomLTDScheduler(ltd_config([1, 2], model_type=model_type), global_batch_size=3)
    configure_random_ltd(model, ltd_config([1, 2], model_type=model_type), scheduler)
    x = torch.randn(3, 12, 8, dtype=torch.float64, requires_grad=True)
    seq = 12
    if model_type == "decoder":
        mask = causal(seq)
    else:
        mask = torch.zeros(3, 1, seq, seq, dtype=torch.float64)
        mask[0, ..., -3:] = float("-inf")  # sample 0 pads its last three tokens
    model.train()
    out = model(x, mask)
    kept = scheduler.sampled_indices  # [2 layers, batch, 6]
    assert kept.shape == (2, 3, 6) and (kept.diff(dim=-1) > 0).all()
    torch.manual_seed(1)
    weight = torch.randn_like(out)
    (out * weight).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]

    plain = Model().double()
    plain.load_state_dict(save_without_random_ltd(model))
    x2 = x.detach().clone().requires_grad_(True)
    h = plain.blocks[0](x2, attention_mask=mask)[0]
    h = reference(plain.blocks[1], h, kept[0], mask, model_type)
    h = reference(plain.blocks[2], h, kept[1], mask, model_type)
    h = plain.blocks[3](h, attention_mask=mask)[0]
    torch.testing.assert_close(out, h, rtol=0, atol=1e-12)
    (h * weight).sum().backward()
    for got, want in zip(grads, [p.grad for p in plain.parameters()] + [x2.grad]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_seq_batch_dim_and_bit_exact_pass_through():
    torch.manual_seed(0)
    layer = RandomLayerTokenDrop(Block(batch_first=False))
    scheduler = RandomLTDScheduler(ltd_config([0], total=1, order="seq_batch_dim"), global_batch_size=2)
    layer.init_config(ltd_config([0], total=1, order="seq_batch_dim"), scheduler, 0)
    x = torch.randn(12, 2, 8)  # [seq, batch, hidden]
    out, extra = layer(x)
    kept = scheduler.sampled_indices[0]
    assert extra == "extra"
    for b in range(2):
        dropped = sorted(set(range(12)) - set(kept[b].tolist()))
        assert torch.equal(out[dropped, b], x[dropped, b])  # bit for bit
        want = layer.random_ltd_layer(x[kept[b], b:b + 1])[0][:, 0]
        torch.testing.assert_close(out[kept[b], b], want)
    layer.eval()
    torch.testing.assert_close(layer(x)[0], layer.random_ltd_layer(x)[0])  # evaluation keeps every token


def test_encoder_masks_are_gathered_per_sample():
    mask = torch.arange(2 * 5 * 5).reshape(2, 1, 5, 5)
    kept = torch.tensor([[0, 3], [1, 4]])
    got = gather_encoder_mask(mask, kept, 5)
    assert got.tolist() == [[[[0, 3], [15, 18]]], [[[31, 34], [46, 49]]]]
    padding = torch.arange(10).reshape(2, 5)  # [batch, seq]
    assert gather_encoder_mask(padding, kept, 5).tolist() == [[0, 3], [6, 9]]
    shared = torch.arange(5).reshape(1, 1, 1, 5)  # one mask for the whole batch
    assert gather_encoder_mask(shared, kept, 5).tolist() == [[[[0, 3]]], [[[1, 4]]]]


def test_kept_tokens_are_uniform_sorted_subsets():
    torch.manual_seed(0)
    kept = sample_token_indices(4, 10, 2000, 1, "cpu")[0]
    assert (kept.diff(dim=1) > 0).all() and kept.min() >= 0 and kept.max() < 10
    counts = torch.bincount(kept.reshape(-1), minlength=10).double()
    assert (counts / counts.sum() - 0.1).abs().max() < 0.01


def test_layers_are_matched_by_index_not_by_name():
    model = Model(layers=12)
    convert_to_random_ltd(model, Block)
    config = ltd_config([1, 10], total=12)
    configure_random_ltd(model, config, RandomLTDScheduler(config, global_batch_size=1))
    configured = [i for i, layer in enumerate(random_ltd_layers(model)) if layer.random_ltd_scheduler is not None]
    assert configured == [1, 10]  # DeepSpeed's `"1" in name` also matched blocks.10 and blocks.11 for id 1
    assert [random_ltd_layers(model)[i].random_ltd_layer_id for i in configured] == [0, 1]
    convert_to_random_ltd(model, Block)  # converting again wraps nothing twice
    assert len(random_ltd_layers(model)) == 12
    with pytest.raises(DataEfficiencyError, match="total_layer_num is 8 but the model has 12"):
        configure_random_ltd(model, ltd_config([1], total=8), RandomLTDScheduler(ltd_config([1], total=8), 1))
    with pytest.raises(DataEfficiencyError, match="positional"):
        layer = random_ltd_layers(model)[1]
        layer.train()
        layer(torch.randn(1, 16, 8), None)


def test_reserved_length_never_below_min_value_and_layer_tokens():
    config = ltd_config([0, 1], total=3, min_value=5, max_value=12)  # seq_per_step 2: DeepSpeed starts at 4
    scheduler = RandomLTDScheduler(config, global_batch_size=10)
    values = [scheduler.get_value(s) for s in range(12)]
    # 5 + 7 * s / 10, rounded down to even, at least 5: 5,5,6,6,6,8,8,8,10,10,12,12
    assert values == [5, 5, 6, 6, 6, 8, 8, 8, 10, 10, 12, 12]
    scheduler.observed_seq_length = 9  # a curriculum shortened the sequences to 9 tokens
    scheduler.step_completed(1)  # step 0 ran with 5 kept tokens in 2 layers, 9 in the third
    assert scheduler.state["consumed_layer_tokens"] == 10 * (5 * 2 + 9 * 1)
    assert scheduler.state["consumed_tokens"] == 10 * 9 and scheduler.get_current_seq() == 5
    for step in range(2, 12):
        scheduler.step_completed(step)
    assert scheduler.get_current_seq() == 12
    assert effective_seq_length(9, 5, 3, 2) == (9 * 1 + 5 * 2) // 3
    assert scheduler.effective_seq_length(9) == 9  # 12 kept of 9: nothing dropped any more
    restored = RandomLTDScheduler(config, global_batch_size=10)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.state == scheduler.state
    with pytest.raises(DataEfficiencyError, match="min_value"):
        RandomLTDScheduler(ltd_config([0], total=3, min_value=4), 10).load_state_dict(scheduler.state_dict())


def test_conversion_changes_no_name_and_deepspeed_state_dicts_load():
    model = Model()
    plain_state = {k: v.clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    convert_to_random_ltd(model, Block)
    assert list(model.state_dict()) == list(plain_state) and [n for n, _ in model.named_parameters()] == names
    wrapper = model.blocks[0]
    assert isinstance(wrapper, RandomLayerTokenDrop) and wrapper.batch_first is True  # the layer's attribute
    model.eval()
    assert not wrapper.random_ltd_layer.training and not wrapper.qkv.training
    model.train()
    assert wrapper.random_ltd_layer.training
    # DeepSpeed's wrapper names every entry "...random_ltd_layer...": such state dicts load, and strip.
    deepspeed_state = {k.replace("blocks.1.", "blocks.1.random_ltd_layer."): torch.zeros_like(v)
                       for k, v in plain_state.items()}
    assert list(remove_random_ltd_state_dict(deepspeed_state)) == list(plain_state)
    model.load_state_dict(deepspeed_state)
    assert all(float(v.abs().sum()) == 0 for v in save_without_random_ltd(model).values())


def test_nothing_to_convert_is_an_error():
    with pytest.raises(DataEfficiencyError, match="no Linear layer"):
        convert_to_random_ltd(nn.Sequential(nn.ReLU()), nn.Linear)
    with pytest.raises(DataEfficiencyError, match=r"nn\.Module class"):
        convert_to_random_ltd(Model(), "Block")
