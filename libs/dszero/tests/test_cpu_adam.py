"""dszero.ops.CPUAdam and cpu_adam_step against torch.optim.Adam/AdamW, native kernel and fallback."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from dszero.errors import ZeroConfigError
from dszero.ops import CPUAdam, DeepSpeedCPUAdam, cpu_adam_step, native_available
from dszero.ops import cpu_adam as cpu_adam_module

FP32 = {"rtol": 1e-6, "atol": 1e-7}
SIZES = [1, 7, 1000003]


@pytest.fixture(params=["native", "fallback"])
def backend(request, monkeypatch):
    if request.param == "native":
        if not native_available():
            pytest.skip("dszero._cpu_adam is not built")
        monkeypatch.delenv("DSZERO_NO_NATIVE", raising=False)
    else:
        monkeypatch.setenv("DSZERO_NO_NATIVE", "1")
    return request.param


def _params(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) for n in sizes]


def _grads(sizes, step):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(n, generator=gen) for n in sizes]


def _train_pair(ours_cls, ours_kw, ref_cls, ref_kw, groups, steps=10):
    """Same start, same grads for both optimizers; returns both lists of params after `steps`."""
    sizes = [n for g in groups for n in g["sizes"]]
    start = _params(sizes)
    results = []
    for cls, kw in ((ours_cls, ours_kw), (ref_cls, ref_kw)):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        it = iter(params)
        param_groups = [{**{k: v for k, v in g.items() if k != "sizes"}, "params": [next(it) for _ in g["sizes"]]}
                        for g in groups]
        opt = cls(param_groups, **kw)
        for step in range(steps):
            for p, grad in zip(params, _grads(sizes, step)):
                p.grad = grad
            opt.step()
        results.append(params)
    return results


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("adamw_mode", [True, False])
def test_matches_torch(backend, adamw_mode, weight_decay):
    ref = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    kw = {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": weight_decay}
    ours, theirs = _train_pair(CPUAdam, {**kw, "adamw_mode": adamw_mode}, ref, kw, [{"sizes": SIZES}])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **FP32)


def test_param_groups_with_their_own_hyperparameters(backend):
    groups = [{"sizes": [7, 33], "lr": 3e-2, "weight_decay": 0.1},
              {"sizes": [1, 4097], "lr": 1e-3, "betas": (0.5, 0.9)},
              {"sizes": [65536 * 3 + 5]}]
    kw = {"lr": 1e-2, "weight_decay": 0.0}  # torch.optim.AdamW defaults to 0.01, CPUAdam (like DeepSpeed) to 0
    ours, theirs = _train_pair(CPUAdam, kw, torch.optim.AdamW, kw, groups)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **FP32)


def _reference_adam(p, grads, lr, beta1, beta2, eps, wd, adamw_mode, bias_correction):
    """Textbook Adam in float64, for the options torch has no switch for (bias_correction=False)."""
    p = p.double().clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        if adamw_mode:
            p *= 1 - lr * wd
        else:
            g = g + wd * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        bc1 = 1 - beta1**t if bias_correction else 1.0
        bc2 = 1 - beta2**t if bias_correction else 1.0
        p -= lr / bc1 * m / (v.sqrt() / math.sqrt(bc2) + eps)
    return p


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_without_bias_correction(backend, adamw_mode):
    start = _params([1000])[0]
    grads = [_grads([1000], s)[0] for s in range(10)]
    p = torch.nn.Parameter(start.clone())
    opt = CPUAdam([p], lr=1e-3, weight_decay=0.02, adamw_mode=adamw_mode, bias_correction=False)
    for g in grads:
        p.grad = g
        opt.step()
    expected = _reference_adam(start, grads, 1e-3, 0.9, 0.999, 1e-8, 0.02, adamw_mode, False)
    torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-6)


def test_function_form_on_flat_buffers_matches_adamw(backend):
    n = 1000003
    start = _params([n])[0]
    flat, m, v = start.clone(), torch.zeros(n), torch.zeros(n)
    ref = torch.nn.Parameter(start.clone())
    opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01)
    for step in range(1, 11):
        grad = _grads([n], step)[0]
        cpu_adam_step(flat, grad, m, v, step, 1e-3, 0.9, 0.999, 1e-8, 0.01)
        ref.grad = grad
        opt.step()
    torch.testing.assert_close(flat, ref.detach(), **FP32)
    torch.testing.assert_close(m, opt.state[ref]["exp_avg"], **FP32)
    torch.testing.assert_close(v, opt.state[ref]["exp_avg_sq"], **FP32)


def _special_values():
    """Values that exercise every branch of the fp32 -> bf16/fp16 roundings."""
    f16 = torch.finfo(torch.float16)
    vals = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, f16.max, 65519.0, 65520.0, 1e6, f16.tiny,
            f16.tiny / 2, 2.0**-24, 2.0**-25, 2.0**-25 * 1.5, 1e-9, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11,
            1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38]
    gen = torch.Generator().manual_seed(3)
    rand = torch.randn(5000, generator=gen) * torch.logspace(-30, 30, 5000)
    return torch.cat([torch.tensor(vals), -torch.tensor(vals), rand])


@pytest.mark.parametrize("low_dtype", [torch.bfloat16, torch.float16])
def test_low_precision_copy_is_the_updated_param_cast(backend, low_dtype):
    n = 1000003
    param, grad = _params([n])[0], _grads([n], 0)[0]
    m, v, low = torch.zeros(n), torch.zeros(n), torch.empty(n, dtype=low_dtype)
    cpu_adam_step(param, grad, m, v, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01, low_precision_copy=low)
    assert torch.equal(low, param.to(low_dtype))
    # lr=0 leaves the param as it was, so the copy is the cast of chosen edge values.
    special = _special_values()
    k = special.numel()
    low = torch.empty(k, dtype=low_dtype)
    cpu_adam_step(special, torch.zeros(k), torch.zeros(k), torch.zeros(k), 1, 0.0, 0.9, 0.999, 1e-8, 0.0,
                  low_precision_copy=low)
    torch.testing.assert_close(low, special.to(low_dtype), rtol=0, atol=0, equal_nan=True)


def _isas():
    if not native_available():
        return []
    from dszero import _cpu_adam

    order = ["generic", "avx2", "avx512"]
    return order[: order.index(_cpu_adam.best_isa()) + 1]


@pytest.mark.skipif(not native_available(), reason="dszero._cpu_adam is not built")
@pytest.mark.parametrize("low_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("adamw_mode", [True, False])
def test_every_instruction_set_and_thread_count_agrees(adamw_mode, low_dtype):
    from dszero import _cpu_adam

    n = 300007
    start, grads = _params([n])[0], [_grads([n], s)[0] for s in range(3)]
    ref = torch.nn.Parameter(start.clone())
    opt = (torch.optim.AdamW if adamw_mode else torch.optim.Adam)([ref], lr=1e-2, weight_decay=0.1)
    for g in grads:
        ref.grad = g
        opt.step()
    results = {}
    for isa in _isas():
        for threads in (1, 3):
            p, m, v, low = start.clone(), torch.zeros(n), torch.zeros(n), torch.empty(n, dtype=low_dtype)
            for step, g in enumerate(grads, start=1):
                _cpu_adam.adam_step(p.data_ptr(), g.data_ptr(), 0, m.data_ptr(), v.data_ptr(), 0, low.data_ptr(),
                                    cpu_adam_module._CODES[low_dtype], n, step, 1e-2, 0.9, 0.999, 1e-8, 0.1,
                                    adamw_mode, True, threads, isa)
            # Generic rounds its multiply-adds twice where ATen fuses them: a few ulps apart.
            torch.testing.assert_close(p, ref.detach(), rtol=1e-6 if isa != "generic" else 1e-5, atol=1e-7)
            assert torch.equal(low, p.to(low_dtype)), isa
            results[isa, threads] = p
        assert torch.equal(results[isa, 1], results[isa, 3]), f"{isa}: threads changed the result"


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_bf16_grads_and_state_native_equals_fallback(monkeypatch, grad_dtype, state_dtype):
    if not native_available():
        pytest.skip("dszero._cpu_adam is not built")
    n = 100003
    out = {}
    for mode in ("native", "fallback"):
        monkeypatch.setenv("DSZERO_NO_NATIVE", "1" if mode == "fallback" else "0")
        p = _params([n])[0]
        m, v = torch.zeros(n, dtype=state_dtype), torch.zeros(n, dtype=state_dtype)
        for step in range(1, 6):
            g = _grads([n], step)[0].to(grad_dtype)
            cpu_adam_step(p, g, m, v, step, 1e-2, 0.9, 0.999, 1e-8, 0.01)
        out[mode] = (p, m, v)
    (p1, m1, v1), (p2, m2, v2) = out["native"], out["fallback"]
    torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
    # A moment an ulp apart in fp32 can round to neighbouring bf16 values.
    torch.testing.assert_close(m1.float(), m2.float(), rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(v1.float(), v2.float(), rtol=2**-7, atol=1e-6)
    if grad_dtype == torch.bfloat16 and state_dtype == torch.float32:
        # bf16 grads are read exactly: the result is fp32 Adam on the upcast grads.
        p3, m3, v3 = _params([n])[0], torch.zeros(n), torch.zeros(n)
        for step in range(1, 6):
            g = _grads([n], step)[0].to(grad_dtype).float()
            cpu_adam_step(p3, g, m3, v3, step, 1e-2, 0.9, 0.999, 1e-8, 0.01)
        assert torch.equal(p1, p3) or torch.allclose(p1, p3, rtol=1e-6, atol=1e-7)


def test_state_dict_round_trip_and_torch_layout(backend):
    sizes = [7, 1000]
    params = [torch.nn.Parameter(t) for t in _params(sizes)]
    opt = CPUAdam(params, lr=1e-2, weight_decay=0.01)
    for step in range(3):
        for p, g in zip(params, _grads(sizes, step)):
            p.grad = g
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert saved["state"][0]["step"].item() == 3.0

    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    restored = CPUAdam(clones, lr=1e-2, weight_decay=0.01)
    restored.load_state_dict(saved)
    # torch's AdamW reads the same state and continues identically (the kernel mirrors its ops).
    torch_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    torch_opt = torch.optim.AdamW(torch_params, lr=1e-2, weight_decay=0.01)
    torch_opt.load_state_dict({"state": copy.deepcopy(saved["state"]),
                               "param_groups": torch_opt.state_dict()["param_groups"]})
    for step in range(3, 6):
        for group in (params, clones, torch_params):
            for p, g in zip(group, _grads(sizes, step)):
                p.grad = g
        opt.step()
        restored.step()
        torch_opt.step()
    for a, b, c in zip(params, clones, torch_params):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, **FP32)
    assert restored.state[clones[0]]["step"].item() == 6.0


def test_non_contiguous_param_and_closure(backend):
    base = _params([12 * 5])[0].view(12, 5)
    ours = torch.nn.Parameter(base.t().contiguous().t())  # column-major layout: not contiguous
    ref = torch.nn.Parameter(base.clone())
    opt, ref_opt = CPUAdam([ours], lr=1e-2, weight_decay=0.01), torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01)
    assert not ours.is_contiguous()
    for step in range(5):
        grad = _grads([60], step)[0].view(12, 5)
        ours.grad, ref.grad = grad.t().contiguous().t(), grad.clone()
        assert opt.step(closure=lambda: torch.tensor(1.5)).item() == 1.5
        ref_opt.step()
    torch.testing.assert_close(ours, ref, **FP32)


def test_fallback_is_announced_once(monkeypatch):
    monkeypatch.delenv("DSZERO_NO_NATIVE", raising=False)
    monkeypatch.setattr(cpu_adam_module, "_native", False)
    monkeypatch.setattr(cpu_adam_module, "_native_problem", "the native CPU Adam kernel is not built (test)")
    monkeypatch.setattr(cpu_adam_module, "_fallback_announced", False)
    p = torch.nn.Parameter(torch.ones(3))
    opt = CPUAdam([p])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            p.grad = torch.ones(3)
            opt.step()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "not built" in messages[0]
    assert not native_available()


def test_deepspeed_name_and_amsgrad_refused():
    assert issubclass(DeepSpeedCPUAdam, CPUAdam)
    with pytest.raises(ZeroConfigError, match="amsgrad"):
        CPUAdam([torch.nn.Parameter(torch.ones(2))], amsgrad=True)


def test_invalid_hyperparameters_listed_together():
    with pytest.raises(ZeroConfigError) as info:
        CPUAdam([torch.nn.Parameter(torch.ones(2))], lr=-1.0, betas=(0.9, 1.0), weight_decay=-0.1)
    message = str(info.value)
    assert "lr=-1.0" in message and "betas=(0.9, 1.0)" in message and "weight_decay=-0.1" in message


@pytest.mark.parametrize("bad", [torch.ones(2, dtype=torch.float64), torch.ones(2, device="meta")])
def test_optimizer_refuses_at_the_step_params_it_cannot_update(bad):
    # Built over device parameters is fine (ZeRO rebinds the groups to CPU masters); stepping them is not.
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(bad)]
    opt = CPUAdam(params)
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(ZeroConfigError, match=r"param_groups\[0\]\['params'\]\[1\].*float16 CPU"):
        opt.step()


@pytest.mark.parametrize("low_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fp32_states", [True, False])
def test_low_precision_params_step_through_float32_with_the_chosen_state_dtype(backend, low_dtype, fp32_states):
    """ZeRO's bf16/fp16 master weights: moments in fp32 (the default) or in the parameter's dtype, and the
    parameter is the float32 update rounded once, the same as AdamW on a float32 copy rounded."""
    if backend == "native" and low_dtype == torch.float16 and not fp32_states:
        pytest.skip("fp16 moments run on the fallback path only")
    start = _params([1000])[0].to(low_dtype)
    ours = torch.nn.Parameter(start.clone())
    ref = torch.nn.Parameter(start.float())
    opt = CPUAdam([ours], lr=1e-2, weight_decay=0.01, fp32_optimizer_states=fp32_states)
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01)
    grad = _grads([1000], 0)[0]
    ours.grad, ref.grad = grad.to(low_dtype), grad.to(low_dtype).float()
    opt.step()
    ref_opt.step()
    state = opt.state[ours]
    assert ours.dtype == low_dtype
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == (torch.float32 if fp32_states else low_dtype)
    one_rounding = 2.0**-7 if low_dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(ours.float(), ref.detach(), rtol=one_rounding, atol=1e-6)
    if fp32_states:
        torch.testing.assert_close(state["exp_avg"], ref_opt.state[ref]["exp_avg"], **FP32)


def _flat(n=8, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((torch.ones(8, device="meta"), _flat(), _flat(), _flat()), r"param is on meta .*CPU tensors only"),
        ((_flat(), torch.ones(8, device="meta"), _flat(), _flat()), r"grad is on meta .*shape=\(8,\)"),
        ((_flat(), torch.ones(8, 2).t(), _flat(), _flat()), r"grad is not contiguous .*stride="),
        ((_flat(), _flat(7), _flat(), _flat()), r"grad has 7 elements .* param has 8"),
        ((_flat(), _flat(), _flat(), _flat(9)), r"exp_avg_sq has 9 elements"),
        ((_flat(dtype=torch.float64), _flat(), _flat(), _flat()), r"param has dtype torch.float64 .*valid: torch.float32"),
        ((_flat(), _flat(dtype=torch.float16), _flat(), _flat()), r"grad has dtype torch.float16 .*torch.bfloat16"),
        ((_flat(), _flat(), _flat(dtype=torch.bfloat16), _flat()), r"exp_avg_sq has dtype torch.float32 .*valid: torch.bfloat16"),
        ((_flat(), _flat(), _flat(), [0.0] * 8), r"exp_avg_sq must be a torch.Tensor, got list"),
    ],
)
def test_function_form_errors_name_the_tensor(backend, args, pattern):
    with pytest.raises(ZeroConfigError, match=pattern):
        cpu_adam_step(*args, 1, 1e-3, 0.9, 0.999, 1e-8)


def test_function_form_rejects_bad_copy_and_step(backend):
    with pytest.raises(ZeroConfigError, match=r"low_precision_copy has dtype torch.float32 .*bfloat16 or torch.float16"):
        cpu_adam_step(_flat(), _flat(), _flat(), _flat(), 1, 1e-3, 0.9, 0.999, 1e-8, low_precision_copy=_flat())
    with pytest.raises(ZeroConfigError, match=r"low_precision_copy has 4 elements"):
        cpu_adam_step(_flat(), _flat(), _flat(), _flat(), 1, 1e-3, 0.9, 0.999, 1e-8,
                      low_precision_copy=_flat(4, torch.bfloat16))
    with pytest.raises(ZeroConfigError, match=r"step=0"):
        cpu_adam_step(_flat(), _flat(), _flat(), _flat(), 0, 1e-3, 0.9, 0.999, 1e-8)


@pytest.mark.parametrize("adamw_mode,weight_decay", [(True, 0.1), (False, 0.1), (True, 0.0)])
def test_subgroup_steps_as_step_and_rollback_returns_to_before(backend, adamw_mode, weight_decay):
    """step_subgroup keeps the moments under the sub-group id (two partitions swapped through one slot keep their
    own), equals an ordinary step, and rollback_subgroup undoes it: parameter, moments and step count."""
    sizes = [33, 17]
    partitions = [torch.nn.Parameter(p) for p in _params(sizes)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in partitions]
    kwargs = {"lr": 0.01, "weight_decay": weight_decay, "adamw_mode": adamw_mode}
    expected = CPUAdam(reference, **kwargs)
    slot = torch.nn.Parameter(torch.empty(0))
    optimizer = CPUAdam([slot], **kwargs)
    for step in range(1, 3):
        for ref, p, g in zip(reference, partitions, _grads(sizes, step)):
            ref.grad, p.grad = g.clone(), g.clone()
        expected.step()
        for subgroup, p in enumerate(partitions):  # ZeRO-3's offloaded sub-groups: one partition in the groups
            optimizer.param_groups[0]["params"] = [p]
            optimizer.step_subgroup(subgroup)
    for subgroup, (ref, p) in enumerate(zip(reference, partitions)):
        torch.testing.assert_close(p.data, ref.data, **FP32)
        torch.testing.assert_close(optimizer.state[subgroup]["exp_avg"], expected.state[ref]["exp_avg"], **FP32)
        assert optimizer.state[subgroup]["step"] == 2
    before = [p.detach().clone() for p in partitions]
    moments = [optimizer.state[0][key].clone() for key in ("exp_avg", "exp_avg_sq")]
    optimizer.param_groups[0]["params"] = [partitions[0]]
    partitions[0].grad = _grads(sizes, 3)[0]
    optimizer.step_subgroup(0)
    assert not torch.equal(partitions[0].data, before[0])
    optimizer.rollback_subgroup(0)
    assert optimizer.state[0]["step"] == 2
    torch.testing.assert_close(partitions[0].data, before[0], rtol=1e-5, atol=1e-6)
    for key, moment in zip(("exp_avg", "exp_avg_sq"), moments):
        torch.testing.assert_close(optimizer.state[0][key], moment, rtol=1e-5, atol=1e-6)


def test_subgroup_misuse_is_named():
    optimizer = CPUAdam([torch.nn.Parameter(torch.ones(4))])
    with pytest.raises(RuntimeError, match="Cannot rollback optimizer state for sub_group_id 3"):
        optimizer.rollback_subgroup(3)
    with pytest.raises(ZeroConfigError, match=r"step_subgroup\(0\).*0 parameters in param_groups have a gradient"):
        optimizer.step_subgroup(0)
    p = optimizer.param_groups[0]["params"][0]
    p.grad = torch.ones(4)
    optimizer.step_subgroup(0)
    optimizer.rollback_subgroup(0)
    with pytest.raises(RuntimeError, match="Cannot rollback sub_group_id 0: step count is 0"):
        optimizer.rollback_subgroup(0)
    optimizer.param_groups[0]["params"] = [torch.nn.Parameter(torch.ones(5))]
    optimizer.param_groups[0]["params"][0].grad = torch.ones(5)
    with pytest.raises(ZeroConfigError, match=r"moments have shape \(4,\) but the parameter stepped now has \(5,\)"):
        optimizer.step_subgroup(0)
