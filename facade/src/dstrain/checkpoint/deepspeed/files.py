"""Which files a DeepSpeed checkpoint directory (one tag) holds, found by their names (DeepSpeed 0.14+):

    mp_rank_XX_model_states.pt                        module, scheduler, counters, client state (stages 0-2)
    zero_pp_rank_R_mp_rank_XX_model_states.pt         the same per data rank at stage 3 (parameters as placeholders)
    [bf16_|fp16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt   data rank R's ZeRO partition of the optimizer
    layer_XX-model_states.pt                          a pipeline layer's weights (layers without any: no file)
    layer_L_expert_E_mp_rank_XX_model_states.pt       MoE layer L's global expert E

Nothing is read here but names; every rank range must be complete (0..n-1), or the error names the
first missing file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CheckpointLoadError

_MODEL = re.compile(r"mp_rank_(\d+)_model_states\.pt")
_ZERO3_MODEL = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt")
_OPTIM = re.compile(r"(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")
_LAYER = re.compile(r"layer_(\d+)-model_(?:(\d+)-model_)?states\.pt")
_EXPERT = re.compile(r"layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt")


@dataclass
class DeepSpeedFiles:
    """The files of one DeepSpeed checkpoint directory, by kind and rank."""

    directory: Path
    model: dict[int, Path] = field(default_factory=dict)  # mp rank -> mp_rank_XX_model_states.pt
    zero3_model: dict[tuple[int, int], Path] = field(default_factory=dict)  # (mp, dp) -> stage 3 model states
    optim: dict[tuple[int, int], Path] = field(default_factory=dict)  # (mp, dp) -> ZeRO optimizer partition
    optim_prefix: str = ""  # "", "bf16_" or "fp16_"
    layers: dict[int, dict[int, Path]] = field(default_factory=dict)  # layer -> {tp rank: file}
    experts: dict[tuple[int, int, int], Path] = field(default_factory=dict)  # (moe layer, global expert, mp rank)

    @property
    def mp_ranks(self) -> list[int]:
        return sorted(set(self.model) | {mp for mp, _ in self.zero3_model} | {mp for mp, _ in self.optim}
                      | {mp for _, _, mp in self.experts} | {tp for by_rank in self.layers.values() for tp in by_rank})

    def dp_size(self, kind: str = "optim") -> int:
        found = self.optim if kind == "optim" else self.zero3_model
        return len({dp for mp, dp in found if mp == 0})


def is_deepspeed_directory(directory: Path) -> bool:
    """Whether `directory` holds DeepSpeed's model-states files (the mark of a DeepSpeed checkpoint)."""
    if not directory.is_dir():
        return False
    return any(_MODEL.fullmatch(p.name) or _ZERO3_MODEL.fullmatch(p.name) or _LAYER.fullmatch(p.name)
               for p in directory.iterdir())


def scan(directory: Path) -> DeepSpeedFiles:
    """The DeepSpeed files in `directory`; CheckpointLoadError when none is there or a rank's file is missing."""
    if not directory.is_dir():
        raise CheckpointLoadError(f"{directory}: no such checkpoint directory")
    files = DeepSpeedFiles(directory)
    prefixes = set()
    for path in sorted(directory.iterdir()):
        name = path.name
        if path.is_symlink():
            raise CheckpointLoadError(f"{path}: a link inside a checkpoint directory; a checkpoint's files must be the "
                                      f"files themselves (a planted link could read elsewhere)")
        if m := _ZERO3_MODEL.fullmatch(name):
            files.zero3_model[(int(m[2]), int(m[1]))] = path
        elif m := _MODEL.fullmatch(name):
            files.model[int(m[1])] = path
        elif m := _OPTIM.fullmatch(name):
            files.optim[(int(m[3]), int(m[2]))] = path
            prefixes.add(m[1] or "")
        elif m := _EXPERT.fullmatch(name):
            files.experts[(int(m[1]), int(m[2]), int(m[3]))] = path
        elif m := _LAYER.fullmatch(name):
            files.layers.setdefault(int(m[1]), {})[int(m[2] or 0)] = path
    if len(prefixes) > 1:
        raise CheckpointLoadError(f"{directory}: optimizer files of more than one kind ({sorted(prefixes)} prefixes); "
                                  f"a DeepSpeed checkpoint has one")
    files.optim_prefix = prefixes.pop() if prefixes else ""
    if not (files.model or files.zero3_model or files.layers):
        raise CheckpointLoadError(f"{directory}: no DeepSpeed model-states file (mp_rank_XX_model_states.pt, "
                                  f"zero_pp_rank_R_mp_rank_XX_model_states.pt or layer_XX-model_states.pt)")
    _check_complete(files)
    return files


def _check_complete(files: DeepSpeedFiles) -> None:
    directory = files.directory
    _contiguous(sorted(files.model), lambda r: f"mp_rank_{r:02d}_model_states.pt", directory)
    prefix = files.optim_prefix
    _check_grid(files.optim, directory, "optimizer",
                lambda mp, dp: f"{prefix}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt")
    _check_grid(files.zero3_model, directory, "model-states",
                lambda mp, dp: f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt")
    if files.zero3_model and files.optim and set(files.zero3_model) != set(files.optim):
        missing = sorted(set(files.zero3_model) ^ set(files.optim))
        raise CheckpointLoadError(f"{directory}: stage 3 model-states and optimizer files do not pair up (the "
                                  f"(mp rank, dp rank) pairs {missing} have one without the other)")


def _check_grid(found: dict[tuple[int, int], Path], directory: Path, kind: str, name) -> None:
    """Files by (mp rank, dp rank): every rank of both ranges, the same data-parallel size per mp rank."""
    mps = sorted({mp for mp, _ in found})
    _contiguous(mps, lambda r: name(r, 0), directory)
    for mp in mps:
        _contiguous(sorted(dp for m, dp in found if m == mp), lambda r, mp=mp: name(mp, r), directory)
    sizes = {sum(1 for m, _ in found if m == mp) for mp in mps}
    if len(sizes) > 1:
        raise CheckpointLoadError(f"{directory}: the {kind} files differ in data-parallel size between tensor ranks "
                                  f"({sorted(sizes)}): the checkpoint is incomplete")


def _contiguous(ranks: list[int], name, directory: Path) -> None:
    if not ranks:
        return
    for expected in range(ranks[-1] + 1):
        if expected not in ranks:
            raise CheckpointLoadError(f"{directory / name(expected)} is missing: the checkpoint has "
                                      f"{name(ranks[-1])} but not this one, so it is incomplete")


def _natural_key(path: Path) -> list:
    """Numbers in a name compare as numbers: zero_2_... before zero_12_..."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _files_matching(checkpoint_dir: str | Path, pattern: str) -> list[str]:
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such checkpoint directory")
    found = sorted((p for p in directory.glob(pattern) if p.is_file() and not p.is_symlink()), key=_natural_key)
    if not found:
        raise FileNotFoundError(f"{directory}: no {pattern} files (is it one tag's folder of a DeepSpeed checkpoint?)")
    return [str(p) for p in found]


def get_optim_files(checkpoint_dir: str | Path) -> list[str]:
    """DeepSpeed's optimizer-states files of a tag's folder, in rank order (DeepSpeed's zero_to_fp32 helper)."""
    return _files_matching(checkpoint_dir, "*_optim_states.pt")


def get_model_state_files(checkpoint_dir: str | Path) -> list[str]:
    """DeepSpeed's model-states files of a tag's folder, in rank order."""
    return _files_matching(checkpoint_dir, "*_model_states.pt")
