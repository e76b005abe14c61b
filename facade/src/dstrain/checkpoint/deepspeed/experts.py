"""DeepSpeed's MoE experts in its ZeRO files, named as the whole model names them.

DeepSpeed keeps a rank's experts in a list, so `...deepspeed_experts.0.weight` in data rank 3's optimizer
file is that rank's first local expert, a different expert on each expert-parallel rank; its expert files
(`layer_L_expert_E_mp_rank_XX_model_states.pt`) name each expert by its global id E. The ZeRO pieces are
renamed to global ids the same way: global = expert-parallel rank x local experts + local id, where the
expert-parallel rank of data rank r is r mod ep_size (DeepSpeed's default layout) or r // (dp / ep_size)
with `use_data_before_expert_parallelism`. An expert group's size comes from its name (`ep_size_E`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import CheckpointLoadError

EXPERT_NAME = re.compile(r"(?P<prefix>(?:.*\.)?deepspeed_moe\.experts\.deepspeed_experts\.)(?P<id>\d+)(?P<rest>\..*)")
_GROUP = re.compile(r"ep_size_(\d+)")


def expert_renamer(main: dict, expert_files: dict[str, int], param_groups: list[dict], dp_size: int,
                   where: Path) -> Callable[[int, int, str], str] | None:
    """rename(data rank, group index, local name) -> global name, or None for a model without experts.
    `expert_files`: {a parameter prefix ("moe.deepspeed_moe.experts.deepspeed_experts."): its MoE layer id}."""
    num_experts = main.get("num_experts")
    if not num_experts:
        return None
    if not isinstance(num_experts, list) or not all(isinstance(n, int) and n > 0 for n in num_experts):
        raise CheckpointLoadError(f"{where}: 'num_experts' is {num_experts!r}, not a list of expert counts")
    sizes: dict[int, int] = {}
    for index, group in enumerate(param_groups):
        if group.get("moe"):
            match = _GROUP.fullmatch(str(group.get("name", "")))
            if match is None:
                raise CheckpointLoadError(f"{where}: MoE parameter group {index} is named {group.get('name')!r}, not "
                                          f"ep_size_<n>; its experts' ranks cannot be told")
            sizes[index] = int(match[1])
    data_first = bool((main.get("ds_config") or {}).get("use_data_before_expert_parallelism", False))

    def rename(rank: int, group: int, name: str) -> str:
        ep_size = sizes.get(group)
        match = EXPERT_NAME.fullmatch(name) if ep_size else None
        if match is None:
            return name
        layer = expert_files.get(match["prefix"])
        if layer is None or layer >= len(num_experts) or num_experts[layer] % ep_size or dp_size % ep_size:
            raise CheckpointLoadError(f"{where}: expert parameter {name} of group ep_size_{ep_size} matches no MoE "
                                      f"layer of the expert files (layers {sorted(expert_files)})")
        local_count = num_experts[layer] // ep_size
        ep_rank = rank // (dp_size // ep_size) if data_first else rank % ep_size
        return f"{match['prefix']}{ep_rank * local_count + int(match['id'])}{match['rest']}"

    return rename


def expert_prefixes(expert_states: dict[tuple[int, int, int], dict[str, Any]]) -> dict[str, int]:
    """{parameter prefix: MoE layer id} from the expert files' contents, keyed (layer, expert, mp rank)."""
    prefixes: dict[str, int] = {}
    for (layer, _, _), state in expert_states.items():
        for key in state:
            match = EXPERT_NAME.fullmatch(str(key))
            if match is not None:
                prefixes.setdefault(match["prefix"], layer)
    return prefixes
