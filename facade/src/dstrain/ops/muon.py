"""Muon for hidden matrices, AdamW for everything else, in one optimizer (DeepSpeed's `Muon` type).

A parameter gets Muon when its `use_muon` attribute says so, or, without the attribute, when it
has two or more dimensions; set `p.use_muon = False` on embeddings and output heads. Muon step:
    buf = momentum buf + (1 - momentum) g
    d   = (1 - momentum) g + momentum buf  (nesterov)  or  buf
    O   = NS(d) * sqrt(max(1, rows / cols))      (NS: quintic Newton-Schulz orthogonalisation)
    p   = p (1 - lr weight_decay) - lr O
The other parameters take Adam's update (decoupled weight decay with adam_w_mode, L2 without).

Under ZeRO (any stage) dszero steps it through `step_on_shards`: the momentum and the Adam half are
elementwise on the flat shards, and each matrix is orthogonalised whole, once, by the rank dszero
assigns it to (dszero.TensorShards.transform_whole). Which parameters are Muon's, and which are
orthogonalised per head, is decided from the model by dstrain.ops.muon_params.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_METHODS = ("gram", "standard")
_NORM_EPS = 1e-7
_GRAM_RESTART = 2  # rebuild X from the accumulated polynomial after this many Gram iterations


def _normalised_wide(g: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """fp32 (fp64 stays fp64) copy with rows <= cols (transposed if needed) and Frobenius norm <= 1."""
    x = g.to(torch.promote_types(g.dtype, torch.float32))
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    return x / (x.norm(dim=(-2, -1), keepdim=True) + _NORM_EPS), tall


def _iterate_on_x(x: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def newton_schulz_standard(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic iteration X <- aX + (bA + cA^2)X with A = XXᵀ, on the (batched) matrix itself."""
    x, tall = _normalised_wide(g)
    x = _iterate_on_x(x, steps)
    return x.mT if tall else x


def newton_schulz_gram(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The same iteration carried on the small Gram matrix R = XXᵀ (rows x rows).

    Each step multiplies X on the left by P = aI + bR + cR^2, a polynomial in R, so R itself
    becomes P R P and the product Q of the P's gives the result Q X0 with one wide matmul at the
    end (two with the restart). Square matrices gain nothing and take the standard iteration.
    """
    x, tall = _normalised_wide(g)
    rows, cols = x.size(-2), x.size(-1)
    if cols <= rows:
        x = _iterate_on_x(x, steps)
        return x.mT if tall else x
    a, b, c = NS_COEFFICIENTS
    eye = torch.eye(rows, dtype=x.dtype, device=x.device).expand(*x.shape[:-2], rows, rows)
    gram = x @ x.mT
    q = eye
    for i in range(steps):
        if i == _GRAM_RESTART:  # fold Q into X and start the product again, against round-off growth
            x = q @ x
            gram = x @ x.mT
            q = eye
        poly = a * eye + b * gram + c * gram @ gram
        q = poly @ q
        if i + 1 < steps and i + 1 != _GRAM_RESTART:
            gram = poly @ gram @ poly
    x = q @ x
    return x.mT if tall else x


def _orthogonalise(update: torch.Tensor, method: str, steps: int, num_heads: int | None) -> torch.Tensor:
    shape = update.shape
    if num_heads is not None:  # per-head Muon: [heads * head_dim, in] seen as a batch of heads
        rows, cols = shape[0], update[0].numel()
        if rows % num_heads:
            raise ValueError(f"per_head_muon: {rows} rows do not split into muon_num_heads={num_heads} heads")
        update = update.reshape(num_heads, rows // num_heads, cols)
    elif update.ndim == 4:  # a conv filter is a matrix over its flattened input dims
        update = update.reshape(shape[0], -1)
    ns = newton_schulz_gram if method == "gram" else newton_schulz_standard
    out = ns(update, steps) * math.sqrt(max(1.0, update.size(-2) / update.size(-1)))
    return out.reshape(shape)


def muon_update(grad: torch.Tensor, momentum_buffer: torch.Tensor, momentum: float = 0.95, nesterov: bool = True,
                ns_method: str = "gram", ns_steps: int = 5, num_heads: int | None = None) -> torch.Tensor:
    """One parameter's Muon direction (before lr and weight decay); updates `momentum_buffer` in place.

    The momentum step is elementwise (_momentum_direction), so a sharded optimizer runs it on
    its shards and orthogonalises the assembled whole matrix only.
    """
    return _orthogonalise(_momentum_direction(grad, momentum_buffer, momentum, nesterov), ns_method, ns_steps,
                          num_heads)


def _momentum_direction(grad: torch.Tensor, momentum_buffer: torch.Tensor, momentum: float,
                        nesterov: bool) -> torch.Tensor:
    """Updates `momentum_buffer` in place; returns the direction to orthogonalise (elementwise)."""
    momentum_buffer.lerp_(grad, 1 - momentum)
    return grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer


def _uses_muon(p: torch.Tensor) -> bool:
    flag = getattr(p, "use_muon", None)
    if flag is None:
        return p.ndim >= 2
    if flag and p.ndim < 2:
        raise ValueError(f"a parameter of shape {tuple(p.shape)} has use_muon=True, but Muon orthogonalises "
                         f"matrices (ndim >= 2); set use_muon=False on it")
    return bool(flag)


class Muon(torch.optim.Optimizer):
    """Muon (momentum + Newton-Schulz orthogonalisation) for matrices, AdamW for the rest.

    Each incoming param group is split in two: a Muon group (`use_muon: True`, lr = muon_lr or lr)
    and an Adam group (`use_muon: False`, lr = adam_lr or lr). With per_head_muon, matrices that
    carry `muon_num_heads` are orthogonalised head by head (rows split into that many heads).
    """

    # Not elementwise: under ZeRO dszero steps it through step_on_shards (its whole-tensor step).

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.95, weight_decay: float = 0.0,
                 muon_lr: float | None = None, adam_lr: float | None = None,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, ns_method: str = "gram",
                 ns_steps: int = 5, nesterov: bool = True, adam_w_mode: bool = True, torch_adam: bool = False,
                 per_head_muon: bool = False):
        if ns_method not in NS_METHODS:
            raise ValueError(f"ns_method must be one of {', '.join(map(repr, NS_METHODS))}, got {ns_method!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, betas=tuple(betas), eps=eps,
                        ns_method=ns_method, ns_steps=ns_steps, nesterov=nesterov, adam_w_mode=adam_w_mode)
        del torch_adam  # the Adam half is always this file's own torch code, which matches torch's AdamW
        self.per_head_muon = per_head_muon
        groups = [params] if isinstance(params, torch.Tensor) else list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        split = []
        for group in groups:
            members = group["params"]
            members = [members] if isinstance(members, torch.Tensor) else list(members)
            extra = {k: v for k, v in group.items() if k not in ("params", "muon_lr", "adam_lr")}
            group_lr = group.get("lr", lr)
            # Frozen parameters join neither half, as DeepSpeed's engine builds the groups: with every Muon
            # matrix frozen (partial training) the Muon group would be empty, which ZeRO refuses.
            members = [p for p in members if p.requires_grad]
            muon = [p for p in members if _uses_muon(p)]
            adam = [p for p in members if not _uses_muon(p)]
            if muon:
                split.append({**extra, "params": muon, "use_muon": True,
                              "lr": group.get("muon_lr", muon_lr if muon_lr is not None else group_lr)})
            if adam:
                split.append({**extra, "params": adam, "use_muon": False,
                              "lr": group.get("adam_lr", adam_lr if adam_lr is not None else group_lr)})
        super().__init__(split, defaults)
        if per_head_muon and not any(hasattr(p, "muon_num_heads") for g in self.param_groups if g["use_muon"]
                                     for p in g["params"]):
            raise ValueError("per_head_muon is on but no Muon parameter carries muon_num_heads; tag the attention "
                             "projections (p.muon_num_heads = heads) or set per_head_muon: false")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            step = self._muon_step if group["use_muon"] else self._adam_step
            for p in group["params"]:
                if p.grad is not None:
                    step(p, group)
        return loss

    @torch.no_grad()
    def step_on_shards(self, shards: Any) -> None:
        """The same update on ZeRO's flat master shards (dszero's whole-tensor step, any stage)."""
        directions: dict[torch.Tensor, torch.Tensor] = {}
        group_of: dict[int, dict] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not group["use_muon"]:
                    self._adam_step(p, group)  # elementwise: the flat shard is as good as the tensors
                    continue
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                directions[p] = _momentum_direction(p.grad, state["momentum_buffer"], group["momentum"],
                                                    group["nesterov"])
                group_of[id(p)] = group

        def orthogonalise(tensor: Any, whole: torch.Tensor) -> torch.Tensor:
            group = group_of[id(tensor.master)]
            return _orthogonalise(whole, group["ns_method"], group["ns_steps"], self._heads(tensor.param))

        for p, update in shards.transform_whole(directions, orthogonalise).items():
            lr = group_of[id(p)]["lr"]
            p.mul_(1 - lr * group_of[id(p)]["weight_decay"])
            p.add_(update.to(p.dtype), alpha=-lr)

    def _heads(self, param: torch.Tensor) -> int | None:
        return getattr(param, "muon_num_heads", None) if self.per_head_muon else None

    def _muon_step(self, p: torch.Tensor, group: dict) -> None:
        if p.grad.is_sparse:
            raise RuntimeError("Muon does not support sparse gradients")
        if p.ndim < 2:
            raise RuntimeError(f"Muon's matrix group holds a {p.ndim}-D tensor of {p.numel()} values: a wrapper "
                               f"(ZeRO) flattened it and called step(); dszero.ZeroOptimizer steps it through "
                               f"step_on_shards, which knows the matrices")
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        update = muon_update(p.grad, state["momentum_buffer"], group["momentum"], group["nesterov"],
                             group["ns_method"], group["ns_steps"], self._heads(p))
        lr = group["lr"]
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.to(p.dtype), alpha=-lr)

    def _adam_step(self, p: torch.Tensor, group: dict) -> None:
        if p.grad.is_sparse:
            raise RuntimeError("Muon's Adam half does not support sparse gradients")
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        step = float(state["step"])
        lr, wd = group["lr"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        grad = p.grad
        if group["adam_w_mode"]:
            p.mul_(1 - lr * wd)
        elif wd != 0:
            grad = grad.add(p, alpha=wd)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** step)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
