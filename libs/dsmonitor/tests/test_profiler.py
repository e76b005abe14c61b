"""Flops of small models against counts worked out by hand (a multiply-add is 2 flops, 1 MAC)."""

import os
import re
import time

import pytest
import torch
from torch import nn

from dsmonitor import FlopsProfiler, MonitorConfigError, MonitorError, get_model_profile


def profile(model, *args):
    return get_model_profile(model, args=args, print_profile=False, as_string=False, warm_up=0)


def test_linear():
    flops, macs, params = profile(nn.Linear(64, 32), torch.randn(8, 64))
    assert macs == 8 * 64 * 32 and flops == 2 * macs and params == 64 * 32 + 32


def test_linear_with_leading_batch_dims():
    flops, _, _ = profile(nn.Linear(16, 4, bias=False), torch.randn(2, 3, 16))
    assert flops == 2 * 2 * 3 * 16 * 4


@pytest.mark.parametrize(("groups", "stride", "padding"), [(1, 1, 1), (2, 2, 0), (8, 1, 1)])
def test_conv2d(groups, stride, padding):
    conv = nn.Conv2d(8, 16, kernel_size=3, stride=stride, padding=padding, groups=groups)
    x = torch.randn(2, 8, 10, 10)
    _, macs, params = profile(conv, x)
    out = conv(x)
    h, w = out.shape[-2:]
    assert macs == 2 * 16 * h * w * (8 // groups) * 3 * 3
    assert params == 16 * (8 // groups) * 9 + 16


class Functional(nn.Module):
    """matmul, bmm and einsum called directly in forward: no submodule, still counted."""

    def forward(self, a, b, c):
        x = torch.matmul(a, b)  # (4, 5) @ (5, 6)
        y = torch.bmm(c, c.transpose(1, 2))  # 3 x (7, 2) @ (2, 7)
        z = torch.einsum("bij,bjk->bik", c, c.transpose(1, 2))  # the same again
        return x, y, z


def test_matmul_bmm_einsum():
    flops, macs, params = profile(Functional(), torch.randn(4, 5), torch.randn(5, 6), torch.randn(3, 7, 2))
    assert macs == 4 * 5 * 6 + 2 * (3 * 7 * 2 * 7) and flops == 2 * macs and params == 0


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, s, d))


def test_attention_block_and_per_module_attribution():
    b, s, d, h = 2, 10, 32, 4
    model = Attention(d, h)
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.randn(b, s, d))
    prof.stop_profile()
    projections = b * s * d * 3 * d + b * s * d * d
    scores_and_mix = 2 * (b * h * s * s * (d // h))
    assert prof.get_total_macs() == projections + scores_and_mix
    assert prof.get_total_flops() == 2 * prof.get_total_macs()
    by_name = {m.name: m for m in prof.module_stats()}
    assert by_name["qkv"].macs == b * s * d * 3 * d and by_name["out"].macs == b * s * d * d
    assert by_name[""].macs - by_name["qkv"].macs - by_name["out"].macs == scores_and_mix  # in forward itself
    assert by_name["qkv"].depth == 1 and by_name[""].depth == 0
    prof.end_profile()


def test_sdpa_is_counted():
    q = torch.randn(2, 4, 10, 8)
    class SDPA(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)
    _, macs, _ = profile(SDPA(), q, q, q)
    assert macs == 2 * (2 * 4 * 10 * 10 * 8)


@pytest.mark.parametrize("fast_path", [True, False])
def test_multihead_attention_inference_fast_path_and_training_path(fast_path):
    b, s, d, h = 2, 10, 32, 4
    mha = nn.MultiheadAttention(d, h, batch_first=True).train(not fast_path)
    x = torch.randn(b, s, d)

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    with torch.set_grad_enabled(not fast_path):  # no grad + eval: the fused _native_multi_head_attention
        _, macs, _ = profile(SelfAttention(), x)
    assert macs == b * s * d * 3 * d + 2 * b * s * s * d + b * s * d * d


class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(0.05)
        return self.lin(x)


def test_duration_covers_the_forward_and_repeated_calls_accumulate():
    model = Sleepy()
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.randn(1, 4))
    model(torch.randn(1, 4))
    prof.stop_profile()
    assert prof.get_total_duration() >= 0.1
    assert prof.get_total_macs() == 2 * 16
    assert prof.get_total_duration(as_string=True).endswith(("ms", " s"))
    prof.reset_profile()
    assert prof.get_total_macs() == 0


def test_frozen_params_are_not_counted():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    assert profile(model, torch.randn(1, 4))[2] == 4 * 2 + 2


def test_print_model_profile_depth_and_top_modules(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    out = tmp_path / "profile.txt"
    flops, macs, params = get_model_profile(model, input_shape=(3, 8), module_depth=1, top_modules=2,
                                            output_file=str(out))
    text = out.read_text()
    assert (flops, macs, params) == ("864", "432 MACs", "162")  # strings by default, as DeepSpeed's
    assert "depth 0:" in text and "depth 1:" in text and "depth 2:" not in text
    assert "{'Sequential': '" in text and "'Linear': '" in text
    assert "(2.0): Linear" not in text and "(2): Sequential" in text  # detailed view cut at depth 1


def test_ignored_module_types_count_in_their_parent():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=[nn.Linear])
    model(torch.randn(1, 4))
    prof.stop_profile()
    assert [m.name for m in prof.module_stats()] == [""] and prof.get_total_macs() == 32


def test_input_shape_builds_a_tensor_on_the_models_device_and_dtype():
    model = nn.Linear(6, 3).double()
    assert get_model_profile(model, input_shape=(5, 6), print_profile=False, as_string=False)[1] == 5 * 6 * 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "needs input_shape, or args"),
    ({"input_shape": (2, 4), "args": (torch.randn(2, 4),)}, "not both"),
    ({"input_shape": (2, -1)}, "tuple of positive ints"),
    ({"input_shape": (2, 4), "module_depth": -2}, "module_depth must be -1"),
    ({"input_shape": (2, 4), "top_modules": 0}, "top_modules must be at least 1"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(MonitorConfigError, match=message):
        get_model_profile(nn.Linear(4, 4), print_profile=False, **kwargs)


def test_reading_before_profiling_is_an_error():
    with pytest.raises(MonitorError, match="call start_profile"):
        FlopsProfiler(nn.Linear(2, 2)).get_total_flops()
    with pytest.raises(MonitorConfigError, match=r"torch\.nn\.Module"):
        FlopsProfiler(lambda x: x)


class _EngineLayout:
    """What print_model_profile reads of the engine it profiles under (by name, as DeepSpeed's engine has them)."""

    def __init__(self, dp_world_size):
        self.world_size, self.dp_world_size, self.seq_dp_world_size, self.mp_world_size = 8, dp_world_size, 4, 1

    def train_micro_batch_size_per_gpu(self):
        return 2


@pytest.mark.parametrize(("dp_world_size", "reported"), [(2, "2"), (None, "4")])
def test_printed_totals_stay_and_the_engine_layout_is_reported(dp_world_size, reported):
    model = nn.Linear(8, 4)
    prof = FlopsProfiler(model, ds_engine=_EngineLayout(dp_world_size))
    assert (prof.flops, prof.macs, prof.params) == (None, None, None)
    prof.start_profile()
    model(torch.randn(3, 8))
    text = prof.print_model_profile(profile_step=1, detailed=False, output_file=os.devnull)
    prof.end_profile()
    assert (prof.flops, prof.macs, prof.params) == (2 * 3 * 8 * 4, 3 * 8 * 4, 36)  # kept after end_profile
    # under Ulysses sequence parallelism dp_world_size is None: the sequence-data-parallel size is the replication
    assert re.search(r"data parallel size:\s+(\S+)", text).group(1) == reported
    assert re.search(r"world size:\s+8", text) and re.search(r"batch size per device:\s+2", text)
