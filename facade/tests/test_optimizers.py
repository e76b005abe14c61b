"""Each optimizer against its formula, and the config factories' choices and errors."""

import math

import pytest
import torch

import dsconfig
from dstrain.engine.optim_factory import build_optimizer, build_scheduler
from dstrain.ops import Lamb, Muon
from dstrain.ops.muon import newton_schulz_gram, newton_schulz_standard


def _opt_config(type_, **params):
    return dsconfig.OptimizerConfig(type=type_, params=params)


def _with_grads(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(*shape, generator=gen, dtype=torch.float64))
        p.grad = torch.randn(*shape, generator=gen, dtype=torch.float64)
        params.append(p)
    return params


# ---------------------------------------------------------------------------------------------- Lamb


def _lamb_reference(p, g, m, v, step, lr, b1, b2, eps, wd, min_c, max_c):
    """One FusedLamb step written elementwise in float64 (python floats)."""
    m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
    v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
    u = [mi / (math.sqrt(vi) + eps) + wd * pi for mi, vi, pi in zip(m, v, p)]
    w_norm = math.sqrt(sum(x * x for x in p))
    u_norm = math.sqrt(sum(x * x for x in u))
    trust = min(max(w_norm / u_norm, min_c), max_c) if w_norm and u_norm else 1.0
    step_size = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
    return [pi - step_size * trust * ui for pi, ui in zip(p, u)], m, v, trust


@pytest.mark.parametrize("max_coeff,min_coeff", [(10.0, 0.01), (0.3, 0.01), (10.0, 5.0)])
def test_lamb_matches_hand_computed_steps(max_coeff, min_coeff):
    (p,) = _with_grads((3, 4))
    opt = Lamb([p], lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, max_coeff=max_coeff, min_coeff=min_coeff)
    ref_p, m, v = p.detach().flatten().tolist(), [0.0] * 12, [0.0] * 12
    for step in (1, 2, 3):
        grad = p.grad.flatten().tolist()
        ref_p, m, v, trust = _lamb_reference(ref_p, grad, m, v, step, 0.05, 0.8, 0.9, 1e-6, 0.1, min_coeff, max_coeff)
        opt.step()
        assert p.detach().flatten().tolist() == pytest.approx(ref_p, rel=1e-12, abs=1e-14)
        assert opt.get_lamb_coeffs() == pytest.approx([trust], rel=1e-12)
        p.grad = torch.randn_like(p)


def test_lamb_zero_weights_take_trust_one_and_clip_by_max_grad_norm():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    p.grad = torch.full((4,), 3.0, dtype=torch.float64)
    Lamb([p], lr=0.1, bias_correction=False).step()
    # no bias correction: m = 0.1 g, v = 0.001 g^2; ||p|| = 0 gives trust 1
    assert p.detach().tolist() == pytest.approx([-0.1 * 0.3 / (math.sqrt(0.009) + 1e-8)] * 4, rel=1e-12)

    (a,) = _with_grads((5,))
    b = torch.nn.Parameter(a.detach().clone())
    norm = a.grad.norm().item()
    b.grad = a.grad / ((norm + 1e-6) / 0.5)
    Lamb([a], max_grad_norm=0.5).step()
    Lamb([b]).step()
    assert torch.allclose(a, b, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="amsgrad"):
        Lamb([a], amsgrad=True)


# ---------------------------------------------------------------------------------------------- Muon


def test_newton_schulz_gram_equals_standard_and_orthogonalises():
    gen = torch.Generator().manual_seed(1)
    for shape in [(8, 32), (32, 8), (16, 16), (3, 6, 20)]:
        g = torch.randn(*shape, generator=gen)
        standard, gram = newton_schulz_standard(g), newton_schulz_gram(g)
        assert torch.allclose(gram, standard, atol=2e-5), shape
    # the quintic's fixed points spread singular values around 1 (about 0.7 .. 1.2), not exactly 1
    singular = torch.linalg.svdvals(newton_schulz_standard(torch.randn(16, 64, generator=gen)))
    assert singular.min() > 0.6 and singular.max() < 1.25


def _ns_reference(g, steps=5):
    """The quintic iteration written out on a float64 copy: transpose tall, normalise, iterate."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (torch.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + b * (s @ x) + c * (s @ s @ x)
    return x.T if tall else x


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("ns_method", ["gram", "standard"])
def test_muon_matches_hand_computed_steps(nesterov, ns_method):
    w, bias = _with_grads((6, 10), (6,))
    emb = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64))
    emb.use_muon = False  # an embedding: a matrix that must take Adam
    emb.grad = torch.randn(5, 4, dtype=torch.float64)
    lr, muon_lr, adam_lr, mom, wd = 0.01, 0.02, 0.003, 0.9, 0.1
    opt = Muon([w, bias, emb], lr=lr, momentum=mom, weight_decay=wd, muon_lr=muon_lr, adam_lr=adam_lr,
               betas=(0.8, 0.95), eps=1e-8, ns_method=ns_method, nesterov=nesterov)
    assert [(g["use_muon"], g["lr"], len(g["params"])) for g in opt.param_groups] == [(True, 0.02, 1), (False, 0.003, 2)]

    ref_w, buf = w.detach().clone(), torch.zeros_like(w)
    adam_ref = [torch.optim.AdamW([torch.nn.Parameter(t.detach().clone())], lr=adam_lr, betas=(0.8, 0.95),
                                  eps=1e-8, weight_decay=wd, foreach=False) for t in (bias, emb)]
    for _ in range(3):
        g = w.grad.clone()
        buf = mom * buf + (1 - mom) * g
        d = (1 - mom) * g + mom * buf if nesterov else buf
        update = _ns_reference(d) * math.sqrt(max(1, 6 / 10))
        ref_w = ref_w * (1 - muon_lr * wd) - muon_lr * update
        for ref, real in zip(adam_ref, (bias, emb)):
            ref.param_groups[0]["params"][0].grad = real.grad.clone()
            ref.step()
        opt.step()
        assert torch.allclose(w.detach(), ref_w, rtol=0, atol=1e-6)
        for ref, real in zip(adam_ref, (bias, emb)):
            assert torch.allclose(real.detach(), ref.param_groups[0]["params"][0].detach(), rtol=1e-12, atol=1e-15)
        for p in (w, bias, emb):
            p.grad = torch.randn_like(p)


def test_muon_tall_matrix_scale_l2_adam_and_errors():
    (w,) = _with_grads((12, 3))
    expected = w.detach() - 0.1 * _ns_reference(w.grad.clone()) * 2.0  # sqrt(12 / 3); momentum 0 -> d = g
    Muon([w], lr=0.1, momentum=0.0, ns_method="standard").step()
    assert torch.allclose(w.detach(), expected, atol=1e-6)

    (b,) = _with_grads((4,))
    ref = torch.nn.Parameter(b.detach().clone())
    ref.grad = b.grad.clone()
    Muon([b], lr=0.01, weight_decay=0.2, adam_w_mode=False).step()
    torch.optim.Adam([ref], lr=0.01, weight_decay=0.2, foreach=False).step()
    assert torch.allclose(b, ref, rtol=1e-12)

    (v,) = _with_grads((4,))
    v.use_muon = True
    with pytest.raises(ValueError, match="use_muon=True"):
        Muon([v])
    with pytest.raises(ValueError, match="ns_method"):
        Muon(_with_grads((2, 2)), ns_method="svd")
    with pytest.raises(ValueError, match="muon_num_heads"):
        Muon(_with_grads((2, 2)), per_head_muon=True)
    flattened = Muon(_with_grads((2, 3)))
    flat = torch.nn.Parameter(torch.zeros(6))  # what a ZeRO wrapper puts in the group
    flat.grad = torch.ones(6)
    flattened.param_groups[0]["params"] = [flat]
    with pytest.raises(RuntimeError, match="step_on_shards"):
        flattened.step()


def test_muon_per_head_orthogonalises_each_head():
    (w,) = _with_grads((8, 6))
    w.muon_num_heads = 2
    heads = [_ns_reference(h) for h in w.grad.clone().view(2, 4, 6)]
    expected = w.detach() - 0.1 * torch.cat(heads)
    Muon([w], lr=0.1, momentum=0.0, ns_method="standard", per_head_muon=True).step()
    assert torch.allclose(w.detach(), expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------- factory


def _params():
    return [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))]


@pytest.mark.parametrize("type_,params,cls,decay", [
    ("Adam", {}, torch.optim.AdamW, 0.0),
    ("Adam", {"adam_w_mode": False, "weight_decay": 0.1}, torch.optim.Adam, 0.1),
    ("AdamW", {"adam_w_mode": False}, torch.optim.AdamW, 0.0),
    ("adam", {"torch_adam": True, "set_grad_none": True, "bias_correction": True, "betas": [0.8, 0.9]},
     torch.optim.AdamW, 0.0),
    ("Lamb", {"adam_w_mode": True, "max_coeff": 2.0}, Lamb, 0.0),
    ("Muon", {"muon_lr": 0.5}, Muon, 0.0),
    ("sgd", {"lr": 0.1, "momentum": 0.9}, torch.optim.SGD, 0.0),
    ("RMSprop", {"lr": 0.1}, torch.optim.RMSprop, 0.0),
])
def test_build_optimizer_picks_the_class(type_, params, cls, decay):
    opt = build_optimizer(_opt_config(type_, **params), _params())
    assert type(opt) is cls
    assert opt.param_groups[0]["weight_decay"] == decay
    if "betas" in params:
        assert opt.param_groups[0]["betas"] == (0.8, 0.9)


def test_adam_from_config_steps_like_torch():
    config_opt = build_optimizer(_opt_config("Adam", lr=0.01, weight_decay=0.1), ps := _params())
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    torch_opt = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.1)
    for p, r in zip(ps, ref):
        p.grad = r.grad = torch.full_like(p, 0.5)
    config_opt.step()
    torch_opt.step()
    assert all(torch.equal(p, r) for p, r in zip(ps, ref))


@pytest.mark.parametrize("type_,params,path,hint", [
    ("Adam", {"bias_correction": False}, "optimizer.params.bias_correction", "FusedAdam"),
    ("SGD", {"lr": 0.1, "momentun": 0.9}, "optimizer.params.momentun", "momentum"),
    ("Lamb", {"adam_w_mode": False}, "optimizer.params.adam_w_mode", "L2"),
    ("Adam", {"lr": "auto", "eps": "auto"}, "optimizer.params.lr", "auto"),
    ("NoSuchOpt", {}, "optimizer.type", "Lamb"),
])
def test_build_optimizer_errors_name_the_key(type_, params, path, hint):
    with pytest.raises(dsconfig.ConfigError) as info:
        build_optimizer(_opt_config(type_, **params), _params())
    assert path in info.value.paths
    assert hint in str(info.value)
    if params.get("eps") == "auto":
        assert "optimizer.params.eps" in info.value.paths


def test_build_scheduler_deepspeed_and_torch_and_errors():
    opt = torch.optim.SGD(_params(), lr=0.1)
    sched = build_scheduler(dsconfig.SchedulerConfig("warmuplr", {"warmup_max_lr": 0.2, "warmup_num_steps": 4}), opt)
    assert type(sched).__name__ == "WarmupLR" and sched.max_lrs == [0.2]
    sched = build_scheduler(dsconfig.SchedulerConfig("StepLR", {"step_size": 2, "gamma": 0.5}), opt)
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR)
    with pytest.raises(dsconfig.ConfigError) as info:
        build_scheduler(dsconfig.SchedulerConfig("WarmupDecayLR", {"warmup_num_step": 3}), opt)
    assert set(info.value.paths) == {"scheduler.params.warmup_num_step", "scheduler.params.total_num_steps"}
    with pytest.raises(dsconfig.ConfigError, match="auto"):
        build_scheduler(dsconfig.SchedulerConfig("WarmupDecayLR", {"total_num_steps": "auto"}), opt)


def test_build_from_a_loaded_config():
    cfg = dsconfig.load({"train_batch_size": 8,
                         "optimizer": {"type": "Muon", "params": {"lr": 0.01, "ns_method": "standard"}},
                         "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10,
                                                                              "warmup_num_steps": 2}}})
    opt = build_optimizer(cfg.optimizer, _params())
    sched = build_scheduler(cfg.scheduler, opt)
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    sched.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01 * (math.log(2) / math.log(2)), 0.01])
