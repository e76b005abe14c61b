"""dszero.ops.CPUAdagrad / CPULion (DeepSpeed's DeepSpeedCPUAdagrad / DeepSpeedCPULion) against their arithmetic."""

import pytest
import torch

from dszero.errors import ZeroConfigError
from dszero.ops import CPUAdagrad, CPULion, DeepSpeedCPUAdagrad, DeepSpeedCPULion


def _params_and_grads(dtype=torch.float32, steps=3):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(n, generator=gen).to(dtype) for n in (5, 129)]
    grads = [[torch.randn(n, generator=gen).to(dtype) for n in (5, 129)] for _ in range(steps)]
    return params, grads


def _run(optimizer_class, params, grads, **kwargs):
    params = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = optimizer_class(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        optimizer.step()
    return params, optimizer


def test_adagrad_equals_torch_without_decay_and_deepspeeds_kernel_with_it():
    params, grads = _params_and_grads()
    ours, _ = _run(DeepSpeedCPUAdagrad, params, grads, lr=0.1, eps=1e-10)
    theirs, _ = _run(torch.optim.Adagrad, params, grads, lr=0.1, eps=1e-10)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    ours, optimizer = _run(CPUAdagrad, params, grads, lr=0.1, eps=1e-8, weight_decay=0.5)
    for p, expected, history in zip(ours, params, zip(*grads)):
        expected, total = expected.clone(), torch.zeros_like(expected)
        for g in history:  # DeepSpeed's kernel: decay in the sum, raw gradient on top
            total += (g + 0.5 * expected) ** 2
            expected -= 0.1 * g / (total.sqrt() + 1e-8)
        torch.testing.assert_close(p.data, expected, rtol=1e-6, atol=1e-7)
        assert optimizer.state[p]["step"] == 3
        torch.testing.assert_close(optimizer.state[p]["exp_avg_sq"], total, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lion_equals_its_arithmetic(weight_decay):
    params, grads = _params_and_grads()
    ours, optimizer = _run(DeepSpeedCPULion, params, grads, lr=0.01, betas=(0.9, 0.99), weight_decay=weight_decay)
    for p, expected, history in zip(ours, params, zip(*grads)):
        expected, moment = expected.clone(), torch.zeros_like(expected)
        for g in history:
            expected = expected * (1 - 0.01 * weight_decay) - 0.01 * torch.sign(0.9 * moment + 0.1 * g)
            moment = 0.99 * moment + 0.01 * g
        torch.testing.assert_close(p.data, expected, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(optimizer.state[p]["exp_avg"], moment, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("optimizer_class", [CPUAdagrad, CPULion])
def test_low_precision_params_step_through_float32_with_float32_state(optimizer_class):
    params, grads = _params_and_grads()
    low, optimizer = _run(optimizer_class, [p.bfloat16() for p in params],
                          [[g.bfloat16() for g in step] for step in grads])
    exact, _ = _run(optimizer_class, [p.bfloat16().float() for p in params],
                    [[g.bfloat16().float() for g in step] for step in grads])
    for p, e in zip(low, exact):
        assert p.dtype == torch.bfloat16
        assert all(s.dtype == torch.float32 for s in optimizer.state[p].values() if torch.is_tensor(s))
        torch.testing.assert_close(p.float(), e.data, rtol=1e-2, atol=1e-2)


def test_what_they_refuse_is_named():
    with pytest.raises(ZeroConfigError, match=r"CPUAdagrad: invalid lr=-1 \(valid: >= 0\)"):
        CPUAdagrad([torch.nn.Parameter(torch.ones(2))], lr=-1)
    with pytest.raises(ZeroConfigError, match=r"CPULion: invalid betas=\(0.9, 1.5\)"):
        CPULion([torch.nn.Parameter(torch.ones(2))], betas=(0.9, 1.5))
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    p.grad = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ZeroConfigError, match=r"param_groups\[0\]\['params'\]\[0\] is a torch.float64 tensor on cpu"):
        CPULion([p]).step()


def test_adagrad_with_a_sparse_gradient_updates_only_the_rows_it_holds_as_torch_does():
    weights = torch.randn(10, 3, generator=torch.Generator().manual_seed(1))
    ours = torch.nn.Embedding(10, 3, sparse=True)
    theirs = torch.nn.Embedding(10, 3, sparse=True)
    with torch.no_grad():
        ours.weight.copy_(weights)
        theirs.weight.copy_(weights)
    flat = torch.nn.Parameter(weights.flatten().clone())  # DeepSpeed's test shape: one sparse dimension
    optimizers = [CPUAdagrad(ours.parameters(), lr=0.1), torch.optim.Adagrad(theirs.parameters(), lr=0.1),
                  CPUAdagrad([flat], lr=0.1)]
    for step in range(3):
        rows = torch.tensor([step, 4, 4, 7])  # a repeated row: the gradient is coalesced first
        for module in (ours, theirs):
            module(rows).sum().backward()
        grad = ours.weight.grad.coalesce()
        flat.grad = torch.sparse_coo_tensor((grad.indices()[0][:, None] * 3 + torch.arange(3)).reshape(1, -1),
                                            grad.values().reshape(-1), (30,))
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(flat.data, theirs.weight.detach().flatten(), rtol=1e-6, atol=1e-7)
    untouched = [r for r in range(10) if r not in (0, 1, 2, 4, 7)]
    assert torch.equal(ours.weight[untouched], weights[untouched])
