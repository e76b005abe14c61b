"""The text of print_model_profile: summary, per-depth aggregation, per-module tree."""

from collections import defaultdict

from .stats import (
    ModuleStats,
    duration_to_string,
    flops_to_string,
    macs_to_string,
    number_to_string,
    params_to_string,
)

RULE = "-" * 30


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "0.00%"


def engine_layout(engine) -> list[str]:
    """The training layout lines of a profile taken under an engine (DeepSpeed's engine attributes, read by name):
    world size, data parallel size (the sequence-data-parallel size where dp_world_size is None, as under
    Ulysses sequence parallelism), model parallel size and batch size per device. None: no lines."""
    if engine is None:
        return []
    data = getattr(engine, "dp_world_size", None)
    if data is None:
        data = getattr(engine, "seq_dp_world_size", None)
    micro = getattr(engine, "train_micro_batch_size_per_gpu", None)
    return [
        f"world size:                             {getattr(engine, 'world_size', None)}",
        f"data parallel size:                     {data}",
        f"model parallel size:                    {getattr(engine, 'mp_world_size', 1)}",
        f"batch size per device:                  {micro() if callable(micro) else micro}",
    ]


def summary(root: ModuleStats, profile_step: int, engine=None) -> list[str]:
    rate = root.flops / root.duration if root.duration else 0.0
    return [
        f"{RULE} dsmonitor Flops Profiler {RULE}",
        f"Profile Summary at step {profile_step}:",
        *engine_layout(engine),
        f"params per device:                      {params_to_string(root.params)}",
        f"fwd MACs per device:                    {macs_to_string(root.macs)}",
        f"fwd flops per device:                   {number_to_string(root.flops)}",
        f"fwd latency:                            {duration_to_string(root.duration)}",
        f"fwd FLOPS per device = fwd flops / fwd latency: {flops_to_string(rate)}",
        "(flops count matmul, bmm, einsum, linear, convolution and attention ops, as torch.utils.flop_counter does)",
    ]


def aggregated(modules: list[ModuleStats], module_depth: int, top_modules: int) -> list[str]:
    """Per depth: modules of the same type summed, the top `top_modules` by params, MACs and latency."""
    by_depth: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0.0]))
    for m in modules:
        totals = by_depth[m.depth][m.type_name]
        totals[0] += m.params
        totals[1] += m.macs
        totals[2] += m.duration
    max_depth = max(by_depth) if by_depth else 0
    last = max_depth if module_depth == -1 else min(module_depth, max_depth)
    lines = [f"{RULE} Aggregated Profile per Device {RULE}",
             f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:"]
    for depth in range(last + 1):
        types = by_depth.get(depth, {})

        def top(index, fmt, types=types):
            ranked = sorted(types.items(), key=lambda kv: kv[1][index], reverse=True)[:top_modules]
            return "{" + ", ".join(f"'{name}': '{fmt(vals[index])}'" for name, vals in ranked) + "}"

        lines += [f"depth {depth}:",
                  f"    params      - {top(0, params_to_string)}",
                  f"    MACs        - {top(1, macs_to_string)}",
                  f"    fwd latency - {top(2, duration_to_string)}"]
    return lines


def detailed(modules: list[ModuleStats], root: ModuleStats, module_depth: int) -> list[str]:
    """One line per module, indented by depth, in the order named_modules visits them."""
    lines = [f"{RULE} Detailed Profile per Device {RULE}",
             "Each module: params, % of total params, MACs, % of total MACs, fwd latency, "
             "% of total fwd latency, fwd FLOPS"]
    for m in modules:
        if module_depth != -1 and m.depth > module_depth:
            continue
        rate = m.flops / m.duration if m.duration else 0.0
        label = f"({m.name}): {m.type_name}" if m.name else m.type_name
        lines.append(
            "  " * m.depth + f"{label}  "
            f"{params_to_string(m.params)} = {_percent(m.params, root.params)} Params, "
            f"{macs_to_string(m.macs)} = {_percent(m.macs, root.macs)} MACs, "
            f"{duration_to_string(m.duration)} = {_percent(m.duration, root.duration)} latency, "
            f"{flops_to_string(rate)}")
    return lines


def render(modules: list[ModuleStats], profile_step: int, module_depth: int, top_modules: int,
           detailed_view: bool, engine=None) -> str:
    root = modules[0]
    lines = [*summary(root, profile_step, engine), "", *aggregated(modules, module_depth, top_modules)]
    if detailed_view:
        lines += ["", *detailed(modules, root, module_depth)]
    lines.append("-" * 80)
    return "\n".join(lines) + "\n"
