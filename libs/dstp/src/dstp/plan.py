"""The partition plan: for every parameter of a model, whether and how it is split (pure Python).

`build_plan(params, specs, tp_size, geometry)` takes the parameters' names and shapes (no tensors),
applies the first matching rule to each, and checks that every split falls on whole sub-parameters
and whole attention heads. A split is described by the dimension it cuts and `parts`: the sizes of
the sub-parameters along it (one part for a plain weight; Q, K and V for a fused one). Each part is
cut into tp_size equal pieces and rank r keeps piece r of every part, so merging and re-splitting at
another degree (checkpoints) need only the plan.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import TensorParallelError
from .geometry import ModelGeometry
from .specs import LayerSpec, ShapeDim

LM_HEAD_NAMES = ("lm_head", "embed_out")
KINDS = ("column", "row", "vocab", "replicated")


@dataclass(frozen=True)
class ParamInfo:
    """A parameter as the planner sees it: `module_kind` is "linear" (nn.Linear), "embedding" or
    "other"; `aliases` are other names of the same tensor (a tied LM head)."""

    name: str
    shape: tuple[int, ...]
    module_kind: str = "other"
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParamPlan:
    name: str
    shape: tuple[int, ...]
    kind: str = "replicated"  # column | row | vocab | replicated
    dim: int | None = None  # the dimension that is cut
    parts: tuple[int, ...] = ()  # sub-parameter sizes along `dim`, each cut into tp_size pieces
    rule: str = "no rule"
    gather_output: bool = False
    grad_allreduce: bool = False
    split_input: bool = False
    note: str = ""

    @property
    def sharded(self) -> bool:
        return self.dim is not None

    def local_shape(self, tp_size: int) -> tuple[int, ...]:
        if self.dim is None:
            return self.shape
        shape = list(self.shape)
        shape[self.dim] //= tp_size
        return tuple(shape)

    def split_text(self, tp_size: int) -> str:
        if self.dim is None:
            return "whole"
        pieces = "+".join(str(p // tp_size) for p in self.parts)
        return f"dim {self.dim}: {pieces} of {'+'.join(map(str, self.parts))}"


@dataclass
class TensorParallelPlan:
    tp_size: int
    params: dict[str, ParamPlan]
    source: str  # where the rules came from
    unmatched: list[str] = field(default_factory=list)  # parameters no rule matched (kept whole)
    conflicts: dict[str, list[str]] = field(default_factory=dict)  # parameter -> every rule that matched it
    notes: list[str] = field(default_factory=list)

    def sharded(self) -> list[ParamPlan]:
        return [p for p in self.params.values() if p.sharded]

    def format(self) -> str:
        """The plan as a table: every parameter, its split, and the rule that chose it."""
        width = max((len(n) for n in self.params), default=10)
        lines = [f"tensor-parallel plan, autotp_size {self.tp_size}, rules from {self.source}",
                 f"{'parameter'.ljust(width)}  {'shape':<18} {'kind':<10} {'split':<28} rule"]
        for plan in self.params.values():
            lines.append(f"{plan.name.ljust(width)}  {list(plan.shape)!s:<18} {plan.kind:<10} "
                         f"{plan.split_text(self.tp_size):<28} {plan.rule}{'  # ' + plan.note if plan.note else ''}")
        sharded = sum(math.prod(p.shape) for p in self.sharded())
        total = sum(math.prod(p.shape) for p in self.params.values()) or 1
        lines.append(f"{len(self.sharded())} of {len(self.params)} parameters split ({100 * sharded / total:.1f}% of "
                     f"the elements)")
        lines.append(f"matched by no rule (kept whole): {len(self.unmatched)}"
                     + "".join(f"\n  {name}" for name in self.unmatched))
        lines.append(f"matched by two or more rules (the first applies): {len(self.conflicts)}"
                     + "".join(f"\n  {name}: {' | '.join(rules)}" for name, rules in self.conflicts.items()))
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"tp_size": self.tp_size, "source": self.source,
                           "params": [asdict(p) for p in self.params.values()]})

    @classmethod
    def from_json(cls, text: str) -> TensorParallelPlan:
        """A plan saved with to_json (read from a checkpoint: every field is checked)."""
        try:
            data = json.loads(text)
            tp_size = int(data["tp_size"])
            params = {}
            for raw in data["params"]:
                plan = ParamPlan(name=str(raw["name"]), shape=tuple(int(d) for d in raw["shape"]),
                                 kind=str(raw["kind"]), dim=None if raw["dim"] is None else int(raw["dim"]),
                                 parts=tuple(int(p) for p in raw["parts"]), rule=str(raw["rule"]),
                                 gather_output=bool(raw["gather_output"]), grad_allreduce=bool(raw["grad_allreduce"]),
                                 split_input=bool(raw["split_input"]), note=str(raw["note"]))
                if plan.kind not in KINDS or (plan.dim is not None and not 0 <= plan.dim < len(plan.shape)):
                    raise ValueError(f"parameter {plan.name}: kind {plan.kind!r} / dim {plan.dim}")
                if plan.dim is not None and (sum(plan.parts) != plan.shape[plan.dim]
                                             or any(p % tp_size for p in plan.parts)):
                    raise ValueError(f"parameter {plan.name}: parts {plan.parts} do not tile dim {plan.dim} of "
                                     f"{plan.shape} in {tp_size} pieces")
                params[plan.name] = plan
            if tp_size < 1:
                raise ValueError(f"tp_size {tp_size}")
            return cls(tp_size, params, str(data["source"]))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            raise TensorParallelError(f"a saved tensor-parallel plan is malformed ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------- planning
def build_plan(params: list[ParamInfo], specs: list[LayerSpec], tp_size: int, geometry: ModelGeometry | None = None,
               *, source: str = "layer_specs", vocab_parallel_lm_head: bool = False) -> TensorParallelPlan:
    """The plan for `params` under the ordered `specs` at degree `tp_size` (see the module docstring).

    Refused, each with the numbers: a pattern of a rule the user wrote that matches no parameter, a
    split that does not divide, attention heads that would be cut, a fused shape that does not fit.
    """
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TensorParallelError(f"tensor_parallel.autotp_size = {tp_size!r}: must be a positive integer")
    geometry = geometry or ModelGeometry()
    model_type = geometry.model_type
    names = [p.name for p in params]
    _check_required_patterns(specs, names, model_type)
    plan = TensorParallelPlan(tp_size, {}, source)
    by_name = {p.name: p for p in params}
    weights_first = sorted(params, key=lambda p: p.name.endswith(".bias") and p.module_kind == "linear")
    head = _lm_head(params) if vocab_parallel_lm_head else None
    if vocab_parallel_lm_head and head is None:
        raise TensorParallelError(f"tensor_parallel.vocab_parallel_lm_head needs a Linear output layer named "
                                  f"{' or '.join(LM_HEAD_NAMES)}; the model has none (parameters: {names[:4]}...)")
    for info in weights_first:
        if info.module_kind == "linear" and info.name.endswith(".bias"):
            weight = plan.params.get(info.name[: -len("bias")] + "weight")
            plan.params[info.name] = _bias_plan(info, weight)
            continue
        if head is not None and info.name == head.name:
            plan.params[info.name] = _vocab_plan(info, tp_size, plan)
            continue
        matching = [s for s in specs if s.matches(info.name, model_type)]
        if not matching:
            plan.unmatched.append(info.name)
            plan.params[info.name] = ParamPlan(info.name, info.shape)
            continue
        if len(matching) > 1:
            plan.conflicts[info.name] = [s.describe() for s in matching]
        plan.params[info.name] = _apply_rule(info, matching[0], tp_size)
    for name, pp in list(plan.params.items()):
        if pp.sharded:
            _check_divides(pp, tp_size, geometry)
        if pp.sharded and by_name[name].aliases:
            raise TensorParallelError(f"{name} is tied to {', '.join(by_name[name].aliases)} (one tensor); rule "
                                      f"{pp.rule} would split one of them only: add a skip rule for it")
    plan.params = {name: plan.params[name] for name in names}  # the model's order
    return plan


def _check_required_patterns(specs: list[LayerSpec], names: list[str], model_type: str | None) -> None:
    for spec in specs:
        if not spec.required or (spec.model_types and (model_type or "").lower() not in
                                 {t.lower() for t in spec.model_types}):
            continue
        for pattern, count in spec.matching_patterns(names).items():
            if count == 0:
                raise TensorParallelError(f"{spec.source}.patterns: {pattern!r} matches no parameter of the model "
                                          f"(model_type {model_type}); names look like {names[:3]}")


def _lm_head(params: list[ParamInfo]) -> ParamInfo | None:
    for info in params:
        parts = info.name.split(".")
        if info.module_kind == "linear" and len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LM_HEAD_NAMES:
            return info
    return None


def _vocab_plan(info: ParamInfo, tp_size: int, plan: TensorParallelPlan) -> ParamPlan:
    if info.aliases:
        plan.notes.append(f"vocab_parallel_lm_head: {info.name} is tied to {', '.join(info.aliases)}, so it stays "
                          f"whole (a vocabulary-parallel LM head needs an untied one)")
        return ParamPlan(info.name, info.shape, rule="vocab_parallel_lm_head", note="tied: kept whole")
    vocab = info.shape[0]
    if vocab % tp_size:
        raise TensorParallelError(f"tensor_parallel.vocab_parallel_lm_head: {info.name} has {vocab} vocabulary rows, "
                                  f"which do not split over autotp_size {tp_size}; pad the vocabulary to a multiple "
                                  f"of {tp_size} (resize_token_embeddings) or turn the key off")
    return ParamPlan(info.name, info.shape, "vocab", 0, (vocab,), "vocab_parallel_lm_head")


def _bias_plan(info: ParamInfo, weight: ParamPlan | None) -> ParamPlan:
    if weight is None or weight.kind in ("replicated", "row"):
        note = "added once, after the all-reduce" if weight is not None and weight.kind == "row" else ""
        return ParamPlan(info.name, info.shape, rule=f"follows {weight.name}" if weight else "no rule", note=note)
    return ParamPlan(info.name, info.shape, weight.kind, 0, weight.parts, f"follows {weight.name}",
                     gather_output=weight.gather_output)


def _apply_rule(info: ParamInfo, spec: LayerSpec, tp_size: int) -> ParamPlan:
    rule = spec.describe()
    if spec.partition_type == "skip":
        return ParamPlan(info.name, info.shape, rule=rule, grad_allreduce=spec.grad_allreduce)
    ndim = len(info.shape)
    if spec.partition_type == "row" and ndim < 2:
        raise TensorParallelError(f"{info.name} (shape {list(info.shape)}) is matched as row-parallel by {rule}, but "
                                  f"a row split cuts the input dimension of a weight matrix; use column or skip")
    if spec.shape is not None:
        dim, parts = _view_parts(info, spec.shape, spec.effective_partition_dim, rule)
    else:
        dim = ndim - 1 if spec.partition_type == "row" else max(ndim - 2, 0)
        size = info.shape[dim]
        if spec.packed:
            if size % spec.packed:
                raise TensorParallelError(f"{info.name}: dim {dim} ({size}) does not hold {spec.packed} packed parts "
                                          f"({rule})")
            parts = (size // spec.packed,) * spec.packed
        else:
            parts = (size,)
    return ParamPlan(info.name, info.shape, spec.partition_type, dim, parts, rule, gather_output=spec.gather_output,
                     split_input=spec.split_input)


def _view_parts(info: ParamInfo, shape: tuple[ShapeDim, ...], pdim: int, rule: str) -> tuple[int, tuple[int, ...]]:
    """(real dimension, parts) of a fused weight seen through the logical `shape`, split at `pdim`."""
    real = info.shape
    entry = shape[pdim]
    sizes = tuple(entry) if isinstance(entry, tuple) else None
    count = entry if isinstance(entry, int) and entry > 0 else 1
    logical: list[int | None] = [None if isinstance(d, int) and d == -1 else d for d in shape]  # type: ignore[misc]
    logical[pdim] = sum(sizes) if sizes else None
    shown = [list(d) if isinstance(d, tuple) else d for d in shape]
    if len(shape) == len(real):
        for index, size in enumerate(logical):
            if size is not None and size != real[index]:
                raise TensorParallelError(f"{info.name}: shape {shown} of {rule} does not fit the parameter's shape "
                                          f"{list(real)} (dim {index}: {size} vs {real[index]})")
        logical = list(real)
    else:
        unknown = [i for i, d in enumerate(logical) if d is None]
        known = math.prod(d for d in logical if d is not None)
        total = math.prod(real)
        if len(unknown) > 1 or (not unknown and known != total) or (unknown and total % known):
            raise TensorParallelError(f"{info.name}: shape {shown} of {rule} cannot view the parameter's shape "
                                      f"{list(real)} ({total} elements)")
        if unknown:
            logical[unknown[0]] = total // known
    # Group the logical dimensions into the real ones they refine.
    groups: list[list[int]] = []
    position = 0
    for size in real:
        group, product = [], 1
        while position < len(logical) and (product < size or not group):
            group.append(position)
            product *= logical[position]  # type: ignore[operator]
            position += 1
        if product != size:
            raise TensorParallelError(f"{info.name}: shape {shown} of {rule} does not refine the parameter's shape "
                                      f"{list(real)}")
        groups.append(group)
    if any(logical[i] != 1 for i in range(position, len(logical))):
        raise TensorParallelError(f"{info.name}: shape {shown} of {rule} has more elements than the parameter "
                                  f"{list(real)}")
    groups[-1] += list(range(position, len(logical)))
    dim = next(i for i, group in enumerate(groups) if pdim in group)
    group = groups[dim]
    at = group.index(pdim)
    outer = math.prod(logical[i] for i in group[:at])  # type: ignore[misc]
    inner = math.prod(logical[i] for i in group[at + 1:])  # type: ignore[misc]
    span = logical[pdim]
    if sizes is None:
        if span % count:  # type: ignore[operator]
            raise TensorParallelError(f"{info.name}: dim {dim} ({real[dim]}) does not hold {count} equal "
                                      f"sub-parameters ({rule})")
        sizes = (span // count,) * count  # type: ignore[operator]
    return dim, tuple(s * inner for s in sizes) * outer


def _check_divides(pp: ParamPlan, tp_size: int, geometry: ModelGeometry) -> None:
    head_dim = geometry.head_dim
    attention = any(word in pp.name for word in ("attn", "attention"))
    if attention and head_dim and pp.kind == "column" and not pp.gather_output:
        for part in pp.parts:
            if part % head_dim == 0 and (part // head_dim) % tp_size:
                heads = part // head_dim
                field_name = ("num_key_value_heads" if heads == geometry.num_key_value_heads
                              and heads != geometry.num_attention_heads else "num_attention_heads")
                valid = [d for d in range(1, heads + 1) if heads % d == 0]
                gqa = geometry.num_key_value_heads or heads
                common = [d for d in range(1, math.gcd(heads, gqa, geometry.num_attention_heads or heads) + 1)
                          if heads % d == 0 and gqa % d == 0 and (geometry.num_attention_heads or heads) % d == 0]
                raise TensorParallelError(f"{pp.name}: {heads} heads ({field_name}, {pp.split_text(1)} rows of "
                                          f"head_dim {head_dim}) do not split over autotp_size {tp_size}; each "
                                          f"rank must keep whole heads: autotp_size must divide {heads} (valid for "
                                          f"this model: {', '.join(map(str, common or valid))})")
    bad = [part for part in pp.parts if part % tp_size]
    if bad:
        raise TensorParallelError(f"{pp.name} (shape {list(pp.shape)}, {pp.kind} by {pp.rule}): dim {pp.dim} part(s) "
                                  f"{bad} do not split over autotp_size {tp_size}; autotp_size must divide "
                                  f"{math.gcd(*pp.parts)}")


def plan_summary(plan: TensorParallelPlan) -> dict[str, Any]:
    """Counts for logs: parameters by kind, unmatched, conflicts."""
    kinds = {kind: sum(1 for p in plan.params.values() if p.kind == kind) for kind in KINDS}
    return {**kinds, "unmatched": len(plan.unmatched), "conflicts": len(plan.conflicts)}
