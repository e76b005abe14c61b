"""On a CUDA GPU: DeepSpeedTransformerLayer forward + backward on the Triton kernels at fp32, bf16 and fp16,
pre- and post-LN, with each memory flag alone and all together, against the torch path in float32 on the
CPU from the same (rounded) weights and inputs; and the kernel checks of triton_checks/ on the device.

Half precision cannot equal float32, so each result is held to twice the error the torch path itself makes
at that dtype on the same GPU, plus a floor, and to an absolute bound. Skipped without CUDA;
DSTRAIN_GPU_REHEARSAL=1 (tools/gpu_check/run.sh --dry-run) runs the same comparisons with the CPU standing
in for the GPU (the torch path both sides: the Triton kernels' CPU checks run under TRITON_INTERPRET=1 in
test_transformer_triton.py already).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dstrain.ops.kernels import backend_name, triton_available
from dstrain.ops.transformer import (
    DeepSpeedTransformerConfig,
    DeepSpeedTransformerLayer,
    count_saved_activations,
)

CUDA = torch.cuda.is_available()
REHEARSAL = os.environ.get("DSTRAIN_GPU_REHEARSAL") == "1"
DEVICE = torch.device("cuda" if CUDA else "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (CUDA or REHEARSAL), reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                    "tools/gpu_check/run.sh --dry-run rehearses it on the CPU")]

CHECKS = Path(__file__).parent / "triton_checks" / "check_triton_kernels.py"
BATCH, SEQ, HIDDEN, HEADS, INTER = 3, 37, 64, 4, 256  # 37: softmax rows and elementwise blocks with a ragged end
FLAG_SETS = {
    "no_flags": {},
    "normalize_invertible": {"normalize_invertible": True},
    "attn_dropout_checkpoint": {"attn_dropout_checkpoint": True},
    "gelu_checkpoint": {"gelu_checkpoint": True},
    "all_flags": {"normalize_invertible": True, "attn_dropout_checkpoint": True, "gelu_checkpoint": True},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Relative error (max |got - want| / max |want|) allowed beyond twice the torch path's own, and in all.
FLOOR = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
BOUND = {torch.float32: 1e-4, torch.bfloat16: 8e-2, torch.float16: 1.2e-2}
PARAMETERS = ("attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb", "inter_w", "inter_b", "output_w",
              "output_b", "norm_w", "norm_b")  # the layer's parameters() order


def ieee_fp32_matmuls():
    """float32 matmuls in full precision (no TF32), whatever this torch's default or API."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "ieee"
    else:
        matmul.allow_tf32 = False


def make_layer(pre_layer_norm: bool, flags: dict, dtype: torch.dtype, dropout: float = 0.0):
    DeepSpeedTransformerLayer.layer_id = 0
    torch.manual_seed(11)
    layer = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(
        hidden_size=HIDDEN, heads=HEADS, intermediate_size=INTER, attn_dropout_ratio=dropout,
        hidden_dropout_ratio=dropout, initializer_range=0.08, num_hidden_layers=2, pre_layer_norm=pre_layer_norm,
        seed=7, **flags))
    with torch.no_grad():  # norms and biases away from 1 / 0, so every gradient path carries signal
        for name, param in layer.named_parameters():
            if name.endswith(("b", "nw")) or name == "norm_w":
                param.add_(0.1 * torch.randn_like(param))
    return layer.to(dtype)


def inputs(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=gen).to(dtype)
    mask = torch.zeros(BATCH, 1, 1, SEQ)
    mask[1, ..., 29:] = -10000.0
    mask[2, ..., 3:9] = -10000.0
    grad = torch.randn(BATCH, SEQ, HIDDEN, generator=gen).to(dtype)
    return x, mask.to(dtype), grad


def outputs(layer, x, mask, grad, device, dtype) -> list[torch.Tensor]:
    """The output, the input's gradient and every parameter's, as float32 on the CPU."""
    layer = layer.to(device=device, dtype=dtype)
    x = x.to(device=device, dtype=dtype).detach().clone().requires_grad_()  # a leaf of its own
    out = layer(x, mask.to(device=device, dtype=dtype))
    out.backward(grad.to(device=device, dtype=dtype))
    return [t.detach().float().cpu() for t in (out, x.grad, *(p.grad for p in layer.parameters()))]


def relative_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[float]:
    return [float((g - w).abs().max() / w.abs().max().clamp_min(1e-12)) for g, w in zip(got, want)]


# The rehearsal on the CPU takes no flag alone (2 CPU cores; the flags' CPU tests are test_transformer_memory.py).
FLAGS_RUN = list(FLAG_SETS) if CUDA else ["no_flags", "all_flags"]


@pytest.mark.parametrize("flags", FLAGS_RUN, ids=FLAGS_RUN)
@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre_ln", "post_ln"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_layer_on_the_gpu_matches_the_float32_cpu_reference(dtype, pre_layer_norm, flags, monkeypatch):
    ieee_fp32_matmuls()
    x, mask, grad = inputs(dtype)
    monkeypatch.setenv("DSTRAIN_KERNELS", "torch")
    # The reference sees exactly the values the GPU sees: weights and inputs rounded to `dtype` first.
    want = outputs(make_layer(pre_layer_norm, FLAG_SETS[flags], dtype), x, mask, grad, "cpu", torch.float32)
    torch_path = outputs(make_layer(pre_layer_norm, FLAG_SETS[flags], dtype), x, mask, grad, DEVICE, dtype)
    monkeypatch.setenv("DSTRAIN_KERNELS", "auto")
    if CUDA:
        if not triton_available():
            pytest.fail("triton is not installed, so the GPU path is the torch path: the Triton kernels went unchecked "
                        "(pip install 'dstrain[kernels]')")
        assert backend_name(x.to(DEVICE)) == "triton"
        gpu_path = outputs(make_layer(pre_layer_norm, FLAG_SETS[flags], dtype), x, mask, grad, DEVICE, dtype)
    else:  # the rehearsal: auto is the torch path on the CPU, computed just above
        gpu_path = torch_path
    torch_errors, gpu_errors = relative_errors(torch_path, want), relative_errors(gpu_path, want)
    names = ["output", "input grad", *(f"{name} grad" for name in PARAMETERS)]
    worse = [f"{name}: {gpu:.2e} (torch path {ref:.2e})" for name, gpu, ref in zip(names, gpu_errors, torch_errors)
             if gpu > 2 * ref + FLOOR[dtype] or gpu > BOUND[dtype]]
    assert not worse, f"relative errors against the float32 reference over the bound {BOUND[dtype]}: {worse}"
    assert max(torch_errors) <= BOUND[dtype], f"the torch path itself: {dict(zip(names, torch_errors))}"


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_dropout_on_the_gpu_repeats_under_one_seed_and_flags_save_memory(dtype):
    """With dropout on, the Triton masks come from Philox, not torch: no reference to compare with, but one
    seed gives one result (forward and every gradient, flags or not) and each flag saves activation bytes."""
    x, mask, grad = inputs(dtype)
    runs, saved = [], {}
    for name in ("no_flags", "no_flags", "all_flags"):
        layer = make_layer(True, FLAG_SETS[name], dtype, dropout=0.1).to(DEVICE)
        xs = x.to(DEVICE).detach().clone().requires_grad_()
        with count_saved_activations(layer.parameters()) as counted:
            out = layer(xs, mask.to(DEVICE))
        out.backward(grad.to(DEVICE))
        runs.append([t.detach().float().cpu() for t in (out, xs.grad, *(p.grad for p in layer.parameters()))])
        saved[name] = counted.bytes
    for first, again in zip(runs[0], runs[1]):
        assert torch.isfinite(first).all()
        assert torch.equal(first, again)
    # The flags change what is kept, not the masks: the same numbers, up to normalize_invertible's rounding.
    assert max(relative_errors(runs[2], runs[0])) <= (1e-4 if dtype == torch.float32 else 5e-2)
    assert saved["all_flags"] < saved["no_flags"], saved


def test_triton_kernel_checks_pass_on_the_gpu():
    if not CUDA:
        pytest.skip("the CPU side of these checks runs under TRITON_INTERPRET=1 in test_transformer_triton.py")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSTRAIN_KERNELS")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                          str(CHECKS)], capture_output=True, text=True, timeout=240, env=env, cwd=CHECKS.parent)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


def test_kernels_address_tensors_past_2_31_elements():
    """Attention probabilities of long sequences pass 2**31 elements: the kernels' offsets are 64-bit. Past
    that point the Triton results equal the torch path's (checked on the last rows only, to stay quick)."""
    if not CUDA:
        pytest.skip("needs a GPU with some 40 GB free; offsets are arithmetic the CPU tests cannot reach")
    from dstrain.ops.kernels import torch_ops, triton_ops

    rows, width = (1 << 21) + 1, 1024  # 2**31 + 1024 elements
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    scores = torch.randn(1, 1, rows, width, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    probs, _ = triton_ops.softmax_dropout_forward(scores, None, 0.125, 0.0, 1)
    tail = slice(rows - 16, rows)
    want, _ = torch_ops.softmax_dropout_forward(scores[:, :, tail], None, 0.125, 0.0, 1)
    torch.testing.assert_close(probs[:, :, tail].float(), want.float(), rtol=1.6e-2, atol=1e-3)
    grads = triton_ops.softmax_dropout_backward(scores, probs, 0.125, 0.0, 1)  # the scores as a gradient
    want = torch_ops.softmax_dropout_backward(scores[:, :, tail], probs[:, :, tail], 0.125, 0.0, 1)
    torch.testing.assert_close(grads[:, :, tail].float(), want.float(), rtol=1.6e-2, atol=1e-3)
    del probs, grads
    x = scores.view(rows, width)
    bias = torch.randn(width, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    torch.testing.assert_close(triton_ops.bias_gelu_forward(x, bias)[tail].float(),
                               torch_ops.bias_gelu_forward(x[tail], bias).float(), rtol=1.6e-2, atol=1e-2)
    del x, scores
    torch.cuda.empty_cache()  # test files run side by side on one GPU: hand the memory back
