"""DeepSpeed's universal checkpoint layout: each parameter whole, in a folder of its own.

    <tag>/mp_rank_00_model_states.pt              module, scheduler, counters, client state (DeepSpeed's)
    <tag>/zero_pp_rank_0_mp_rank_00_model_states.pt   the same for a ZeRO-3 run (what DeepSpeed globs for there)
    <tag>/zero/optimizer_state.pt                 the optimizer's groups (lr, betas, ...) and global state
    <tag>/zero/<parameter name>/fp32.pt           {"param": the fp32 master, whole}
    <tag>/zero/<parameter name>/exp_avg.pt        {"param": Adam's first moment, whole} (every per-element state)
    <tag>/zero/<parameter name>/step.pt           the optimizer's step (a 0-d tensor)
    <root>/latest_universal                       the tag, as DeepSpeed's ds_to_universal writes it

Because every tensor is whole, a universal checkpoint loads at any data-parallel, tensor-parallel or
pipeline layout.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import CheckpointLoadError
from ..paths import MAX_TAG_LENGTH, TAG_RULE, tag_problem

ZERO = "zero"
OPTIMIZER_STATE = "optimizer_state.pt"
PARAM = "param"  # the tensor's key inside each parameter file
FP32 = "fp32"  # the master weights' file stem
STEP = "step"
MODEL_STATES = "mp_rank_00_model_states.pt"
ZERO3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"
LATEST_UNIVERSAL = "latest_universal"
DS_FORMAT_VERSION = "0.19.8"  # the DeepSpeed release whose universal layout the writer follows


def is_universal_directory(directory: Path) -> bool:
    """Whether `directory` is a universal checkpoint: zero/ with per-parameter folders, and a model-states file."""
    zero = directory / ZERO
    if not zero.is_dir() or zero.is_symlink():
        return False
    if not ((directory / MODEL_STATES).is_file() or (directory / ZERO3_MODEL_STATES).is_file()):
        return False
    return (zero / OPTIMIZER_STATE).is_file() or any((p / f"{FP32}.pt").is_file() for p in zero.iterdir())


def check_parameter_name(name: str) -> str:
    """A parameter's folder name: the dotted name itself, which must stay one path component."""
    if not name or name in (".", "..") or any(c in name for c in ("/", "\\", "\0")):
        raise ValueError(f"parameter name {name!r} cannot be a folder name of a universal checkpoint")
    return name


def read_latest_universal(root: Path) -> str | None:
    """The tag `root/latest_universal` names (DeepSpeed's ds_to_universal writes it), or None without one;
    read as the untrusted file it is, like `latest`."""
    path = root / LATEST_UNIVERSAL
    if not path.is_file():
        return None
    raw = path.read_bytes()[: MAX_TAG_LENGTH + 64]
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointLoadError(f"{path} is not UTF-8 text; it should hold one checkpoint tag") from None
    problem = tag_problem(tag)
    if problem is not None:
        raise CheckpointLoadError(f"{path} names {tag!r}, which {problem}; {TAG_RULE}")
    return tag
