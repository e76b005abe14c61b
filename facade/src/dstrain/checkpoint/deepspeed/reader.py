"""A DeepSpeed checkpoint directory (one tag) read whole: `read_deepspeed(tag_dir) -> WholeCheckpoint`.

The module's weights come from the model-states file (stages 0-2), from the fp32 masters at stage 3
(whose model-states files hold placeholders) or from the pipeline's layer files; the masters and Adam's
moments from the optimizer files, whatever the data-parallel size they were cut for; the scheduler,
counters, loss scaler and client state from the model-states file. Every file goes through the
restricted unpickler. Everything is read and checked before anything is returned, so a caller that
loads only a complete result never half-loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointLoadError
from ..contents import MASTER, WholeCheckpoint
from .experts import expert_prefixes, expert_renamer
from .files import DeepSpeedFiles, scan
from .unpickler import RECORD_CLASS_KEY, load_pickle
from .zero_states import sliced_states, stage3_states, unpartitioned_states

# What DeepSpeed itself keeps in a model-states file: everything else there is the client's state. `iteration`
# and `universal_checkpoint_info` are a client's (Megatron-DeepSpeed saves its step and merge patterns there), so
# load_checkpoint returns them as DeepSpeed's engine does.
DEEPSPEED_KEYS = frozenset({
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
    "checkpoint_parallel_dimensions", "num_experts", "ds_autoep_layers", "autoep_layers", "folding",
})


def read_deepspeed(directory: str | Path) -> WholeCheckpoint:
    """Everything a DeepSpeed checkpoint directory holds, each tensor whole."""
    path = Path(directory)
    files = scan(path)
    main_path = files.model.get(0) or files.zero3_model.get((0, 0))
    if main_path is None:
        raise CheckpointLoadError(f"{path}: no mp_rank_00_model_states.pt (a pipeline's layer files alone are not a "
                                  f"checkpoint: DeepSpeed writes the model-states file beside them)")
    main = _checked_dict(load_pickle(main_path), main_path)
    stages = _pipeline_stages(files, main, main_path)
    expert_states = {key: _checked_dict(load_pickle(p), p) for key, p in sorted(files.experts.items())}
    module = _module_state(files, main, main_path, expert_states)
    states: dict[str, dict[str, torch.Tensor]] = {}
    scalars: dict[str, Any] = {}
    first_optim: dict = {}
    for stage in range(stages):  # one model-states file and set of optimizer files per pipeline stage
        stage_main = main if stage == 0 else _checked_dict(load_pickle(files.model[stage]), files.model[stage])
        stage_states, stage_scalars, optim = _stage_states(files, main, stage_main, stage, module, expert_states)
        if optim and "fp32_flat_groups" in optim:
            module = _stage3_module(files, stage_main, module, stage_states, main_path)
        states.update(stage_states)
        scalars = scalars or stage_scalars
        first_optim = first_optim or optim
    for name, entry in states.items():
        if MASTER not in entry:
            if name not in module:
                raise CheckpointLoadError(f"{main_path}: the optimizer holds state for {name}, which the module "
                                          f"does not have")
            entry[MASTER] = module[name].float()
    return WholeCheckpoint(
        module=module, parameters=states, scalars=scalars,
        lr_scheduler=main.get("lr_scheduler") if isinstance(main.get("lr_scheduler"), dict) else None,
        client_state={k: v for k, v in main.items() if k not in DEEPSPEED_KEYS},
        progress=_progress(main, main_path), loss_scaler=loss_scaler_state(first_optim),
        param_groups=_group_settings(first_optim), source="deepspeed", path=str(path))


def _stage_states(files: DeepSpeedFiles, main: dict, stage_main: dict, stage: int, module: dict[str, torch.Tensor],
                  expert_states: dict) -> tuple[dict, dict[str, Any], dict]:
    """One pipeline stage's (or the whole run's) per-parameter states and scalars, and its first optimizer
    state dict (the loss scaler and group settings are read from it)."""
    main_path = files.model.get(stage) or files.zero3_model.get((stage, 0))
    paths = _optim_paths(files, stage)
    _check_dp_size(files, paths, main, stage)
    optim = [(p, _optimizer_state(load_pickle(p), p)) for p in paths]
    if main.get("num_experts") and not (optim and "single_partition_of_fp32_groups" in optim[0][1]):
        raise CheckpointLoadError(f"{files.directory}: an MoE checkpoint of DeepSpeed's "
                                  f"{'ZeRO-3' if optim else 'optimizer without ZeRO'}: its experts' optimizer state "
                                  f"is not read here (ZeRO-1/2 ones are); convert it with DeepSpeed's ds_to_universal "
                                  f"and load that with checkpoint.load_universal")
    if optim and "fp32_flat_groups" in optim[0][1]:
        return (*stage3_states(optim, _param_shapes(stage_main, main_path)), optim[0][1])
    if optim:
        rename = expert_renamer(main, expert_prefixes(expert_states), _group_settings(optim[0][1]), len(optim),
                                main_path)
        return (*sliced_states(optim, _param_shapes(stage_main, main_path), rename), optim[0][1])
    if isinstance(stage_main.get("optimizer"), dict):  # no ZeRO: torch's optimizer state in the model file
        trained = _trained_names(stage_main, module)
        shapes = {n: tuple(module[n].shape) for n in trained}
        return (*unpartitioned_states(stage_main["optimizer"], trained, shapes, main_path), stage_main["optimizer"])
    return {}, {}, {}


def _pipeline_stages(files: DeepSpeedFiles, main: dict, main_path: Path) -> int:
    """How many pipeline stages wrote files (DeepSpeed numbers a pipeline's stages as its mp ranks); a
    checkpoint cut by tensor parallelism is refused."""
    dims = main.get("checkpoint_parallel_dimensions")
    tp = dims.get("tp_degree", 1) if isinstance(dims, dict) else main.get("mp_world_size", 1)
    ranks = len(files.mp_ranks)
    if tp not in (1, None) or (ranks > 1 and not files.layers):
        raise CheckpointLoadError(f"{main_path.parent}: saved with tensor parallelism ({tp} tensor ranks, {ranks} mp "
                                  f"files); DeepSpeed's files cut by tensor parallelism are not read here: convert it "
                                  f"with DeepSpeed's ds_to_universal and load that with checkpoint.load_universal")
    missing = [r for r in range(ranks) if r not in files.model and (r, 0) not in files.zero3_model]
    if missing:
        raise CheckpointLoadError(f"{main_path.parent}: the model-states file of pipeline stage(s) {missing} is missing")
    return ranks


def _checked_dict(value: Any, path: Path) -> dict:
    if not isinstance(value, dict):
        raise CheckpointLoadError(f"{path}: holds a {type(value).__name__}, not DeepSpeed's state dict")
    return value


def _optim_paths(files: DeepSpeedFiles, mp_rank: int) -> list[Path]:
    return [files.optim[(mp_rank, dp)] for dp in range(files.dp_size("optim")) if (mp_rank, dp) in files.optim]


def _check_dp_size(files: DeepSpeedFiles, paths: list[Path], main: dict, stage: int) -> None:
    """Every data rank's optimizer file is there (the model-states file says how many ranks saved)."""
    saved = main.get("dp_world_size")
    if not paths or not isinstance(saved, int) or len(paths) >= saved:
        return
    name = f"{files.optim_prefix}zero_pp_rank_{len(paths)}_mp_rank_{stage:02d}_optim_states.pt"
    raise CheckpointLoadError(f"{files.directory / name} is missing: the checkpoint was saved by {saved} data-parallel "
                              f"ranks and only {len(paths)} optimizer file(s) are there")


def _optimizer_state(value: Any, path: Path) -> dict:
    state = _checked_dict(value, path).get("optimizer_state_dict")
    if not isinstance(state, dict):
        raise CheckpointLoadError(f"{path}: no 'optimizer_state_dict'; not a DeepSpeed optimizer file")
    return state


def _param_shapes(main: dict, path: Path) -> list[dict[str, tuple[int, ...]]]:
    shapes = main.get("param_shapes")
    if isinstance(shapes, dict):
        shapes = [shapes]
    if not isinstance(shapes, list) or not all(isinstance(s, dict) for s in shapes):
        raise CheckpointLoadError(f"{path}: 'param_shapes' is missing or malformed; the ZeRO files cannot be cut into "
                                  f"parameters without it")
    return [{str(k): tuple(int(d) for d in v) for k, v in s.items()} for s in shapes]


def _module_state(files: DeepSpeedFiles, main: dict, main_path: Path,
                  expert_states: dict[tuple[int, int, int], dict]) -> dict[str, torch.Tensor]:
    module = main.get("module")
    state: dict[str, torch.Tensor] = {}
    if isinstance(module, dict):
        state.update({str(k): v for k, v in module.items() if torch.is_tensor(v)})
    elif not files.layers:
        raise CheckpointLoadError(f"{main_path}: no 'module' and no layer_XX-model_states.pt files: the weights are "
                                  f"missing")
    for layer, by_rank in sorted(files.layers.items()):
        layer_path = by_rank[min(by_rank)]
        for key, value in _checked_dict(load_pickle(layer_path), layer_path).items():
            if torch.is_tensor(value):
                state[f"{layer}.{key}"] = value
    for expert_state in expert_states.values():  # named by global expert id, as the whole model names them
        state.update({str(k): v for k, v in expert_state.items() if torch.is_tensor(v)})
    return state


def _trained_names(main: dict, module: dict[str, torch.Tensor]) -> list[str]:
    """The parameters torch's optimizer numbered (no ZeRO): the module's entries that are neither buffers
    nor second names of a shared parameter, in order."""
    buffers = set(main.get("buffer_names") or [])
    shared = set((main.get("shared_params") or {}).keys())
    frozen = set((main.get("frozen_param_shapes") or {}).keys())
    return [n for n in module if n not in buffers and n not in shared and n not in frozen]


def _stage3_module(files: DeepSpeedFiles, main: dict, module: dict[str, torch.Tensor],
                   states: dict[str, dict[str, torch.Tensor]], main_path: Path) -> dict[str, torch.Tensor]:
    """Stage 3's module files hold empty placeholders for what ZeRO partitions: the trained parameters come
    from their fp32 masters (in the placeholder's dtype), frozen ones from every rank's fragments."""
    whole = dict(module)
    for name, entry in states.items():
        dtype = module[name].dtype if name in module else torch.float32
        whole[name] = entry[MASTER].to(dtype)
    for alias, holder in (main.get("shared_params") or {}).items():
        if holder in whole:
            whole[alias] = whole[holder]
    frozen_shapes = main.get("frozen_param_shapes") or {}
    if frozen_shapes:
        ranks = [files.zero3_model[(0, dp)] for dp in range(files.dp_size("model"))]
        fragments = [load_pickle(p).get("frozen_param_fragments") or {} for p in ranks]
        for name, shape in frozen_shapes.items():
            numel = 1
            for d in shape:
                numel *= int(d)
            pieces = [f.get(name) for f in fragments]
            if any(p is None for p in pieces):
                raise CheckpointLoadError(f"{main_path.parent}: a rank's model-states file lacks the fragment of frozen "
                                          f"parameter {name}")
            flat = torch.cat([p.reshape(-1) for p in pieces])
            if flat.numel() < numel:
                raise CheckpointLoadError(f"{main_path.parent}: frozen parameter {name} has {flat.numel()} elements "
                                          f"over the ranks, its shape {tuple(shape)} needs {numel}")
            whole[name] = flat[:numel].reshape(tuple(int(d) for d in shape)).clone()
    empty = [n for n, t in whole.items() if t.numel() == 0 and n in module and n not in states]
    if empty:
        raise CheckpointLoadError(f"{main_path}: {empty[:5]} are placeholders that no optimizer file fills")
    return whole


def _progress(main: dict, path: Path) -> dict[str, int]:
    progress = {}
    for key in ("global_steps", "global_samples", "skipped_steps"):
        value = main.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CheckpointLoadError(f"{path}: '{key}' is {value!r}, not a non-negative integer")
            progress[key] = value
    if "global_steps" not in progress:
        raise CheckpointLoadError(f"{path}: 'global_steps' is missing; not a DeepSpeed engine checkpoint")
    return progress


def loss_scaler_state(optimizer_state: dict) -> dict[str, Any] | None:
    """DeepSpeed's loss scaler (a LossScaler / DynamicLossScaler record, or the fp16 optimizer's own fields)
    as dszero's scaler state: scale, hysteresis_left, steps, last_overflow_step; None for a static scale of 1."""
    record = optimizer_state.get("loss_scaler") if isinstance(optimizer_state, dict) else None
    if isinstance(record, dict) and RECORD_CLASS_KEY in record:
        fields = record
    elif isinstance(optimizer_state, dict) and "cur_scale" in optimizer_state:
        fields = optimizer_state
    else:
        return None
    dynamic = bool(fields.get("dynamic")) or "cur_iter" in fields or "DynamicLossScaler" in str(
        fields.get(RECORD_CLASS_KEY, ""))
    if not dynamic and float(fields.get("cur_scale", 1.0)) == 1.0:
        return None  # bf16 and fp32 runs keep a static scale of 1: nothing to restore, whatever this run scales by
    state: dict[str, Any] = {"scale": float(fields.get("cur_scale", 1.0))}
    if "cur_hysteresis" in fields:
        state["hysteresis_left"] = int(fields["cur_hysteresis"])
    if "cur_iter" in fields:
        state["steps"] = int(fields["cur_iter"])
    if "last_overflow_iter" in fields:
        state["last_overflow_step"] = int(fields["last_overflow_iter"])
    return state


def _group_settings(optimizer_state: Any) -> list[dict[str, Any]]:
    """The optimizer's per-group settings (lr, betas, weight decay...), without the parameter lists."""
    if not isinstance(optimizer_state, dict):
        return []
    inner = optimizer_state.get("base_optimizer_state") or optimizer_state.get("optimizer_state_dict") \
        or optimizer_state
    groups = inner.get("param_groups") if isinstance(inner, dict) else None
    if not isinstance(groups, list):
        return []
    return [{k: v for k, v in g.items() if k != "params"} for g in groups if isinstance(g, dict)]
