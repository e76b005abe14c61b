"""A dstrain checkpoint of a data-parallel run read whole, for the conversion to the universal layout.

STAND-IN: the checkpoint seam (issue 30, section 1) brings `read_whole(path)` for dstrain checkpoints at
every layout (tensor, pipeline, expert); until it lands, this reads the plain data-parallel layout only:
the module file, dszero's shards parameter by parameter (`read_parameter_states`), the common file and
rank 0's counters. Tensor-parallel and pipeline checkpoints are refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import dsaio
import dszero
from dszero.checkpoint import read_parameter_states, verify_manifest

from ...errors import CheckpointLoadError
from ..contents import WholeCheckpoint

COMMON_FILE = "engine_common.safetensors"  # engine_checkpoint's names (its helpers are its own)
MODEL_FILE = "model_states.safetensors"
ZERO_DIR = "zero"
ZERO_META = "zero_meta.json"
RANK0_FILE = "engine_rank00000.safetensors"


def is_dstrain_directory(directory: Path) -> bool:
    return (directory / COMMON_FILE).is_file()


def read_dstrain(directory: str | Path) -> WholeCheckpoint:
    path = Path(directory)
    try:
        verify_manifest(path)
        common = dsaio.load_state_dict(path / COMMON_FILE)
        if "tp_size" in common or "pipeline" in common:
            raise CheckpointLoadError(f"{path}: a tensor-parallel or pipeline dstrain checkpoint; converting those to "
                                      f"the universal layout comes with the checkpoint seam (issue 30); load it into a "
                                      f"data-parallel run and save again to convert it")
        module = dict(dsaio.load_state_dict(path / MODEL_FILE))
        states, scalars = read_parameter_states(path / ZERO_DIR)
        meta = json.loads((path / ZERO_DIR / ZERO_META).read_text())
        rank0 = dsaio.load_state_dict(path / RANK0_FILE) if (path / RANK0_FILE).is_file() else {}
    except (dszero.CheckpointError, dsaio.CheckpointError, OSError, json.JSONDecodeError) as exc:
        raise CheckpointLoadError(f"{path}: {exc}") from None
    for name, entry in states.items():
        if name not in module:  # stage 3 keeps trained parameters in the shards only
            module[name] = entry["master"]
    progress = {k: int(rank0[k]) for k in ("global_steps", "global_samples", "micro_steps") if k in rank0}
    progress.setdefault("global_steps", int(common["global_steps"]))
    progress["skipped_steps"] = int(meta.get("skipped_steps", 0))
    return WholeCheckpoint(module=module, parameters=states, scalars=scalars,
                           optimizer_groups=list(meta.get("param_groups") or []), lr_scheduler=common["lr_scheduler"],
                           client_state=dict(common["client_state"] or {}), progress=progress,
                           loss_scaler=meta.get("scaler"), step_hooks=dict(common.get("step_hooks") or {}),
                           source="dstrain", path=str(path))
