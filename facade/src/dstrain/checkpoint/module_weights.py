"""The module's weights and buffers as a checkpoint part, in each layout:

- plain, data and tensor parallel: `model_states.safetensors` in the rank's directory, written by its
  data group's first rank, without what other files hold (the experts' own files; at ZeRO stage 3 the
  trained parameters, which live in ZeRO's shards; frozen ones under exclude_frozen_parameters);
- pipeline: one file per layer (dspipe writes them through `LayerFiles`, each recording its layer and
  its name prefix in the module, so the checkpoint reads whole without the model); with tensor
  parallelism (3D) one per layer and tensor rank (`layer_XX-model_YY-...`, recording "model": YY), merged
  by the saved plan when read whole;
- experts: one file per (MoE layer, global expert), experts.py.

At another layout every file is read whole by name (tensor-parallel shards merged by the saved plan,
AutoEP slices stacked, stage 3's weights from the fp32 masters) and cut for this rank (`RunLayout.cut`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

import dsaio
import dszero
from dszero.units import full_shape

from ..errors import CheckpointLoadError, DstrainError
from .contents import MASTER
from .experts import expert_state_names, load_expert_files, read_expert_files, save_expert_files
from .files import MODEL_FILE, ZERO_DIR, layer_file_tensor_rank, parse_layer_file
from .saved import EXCLUDED_FROZEN

if TYPE_CHECKING:
    from .contents import WholeCheckpoint
    from .layout import RunLayout
    from .protocol import LoadOptions, LoadSource, SaveTarget
    from .saved import SavedCheckpoint

SHARED_PARAMS = "shared_params"  # in the common file: {a tied parameter's other name: the name ZeRO keeps it under}
FROZEN_PARAMS = "frozen_params"  # in the common file: the saved parameters with requires_grad False (zero_to_fp32)
SHARDED_DTYPES = "sharded_dtypes"  # in the common file at stage 3: {trained parameter: its dtype} (kept by ZeRO)
_DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


def shared_parameter_names(module: torch.nn.Module) -> dict[str, str]:
    """{every further name of a parameter the module holds under several names (tied weights): its first name}."""
    first: dict[int, str] = {}
    shared = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            shared[name] = first[id(param)]
        else:
            first[id(param)] = name
    return shared


class LayerFiles:
    """dspipe's checkpoint engine over dsaio's safetensors files (nothing is ever unpickled); on save, each
    layer file records its layer and where its keys sit in the module (`prefix`).

    A layer file is written by one data rank of its stage, but a stage's experts are spread over its
    expert-parallel ranks: they live in their own files (experts.py), so a layer file leaves them out,
    and on load the layer takes its current experts until their files are read (`experts`: this rank's
    expert entries by full name)."""

    suffix = ".safetensors"

    def __init__(self, out: SaveTarget | None = None, prefixes: dict[int, str] | None = None,
                 experts: dict[str, torch.Tensor] | None = None):
        self.out = out
        self.prefixes = prefixes or {}
        self.experts = experts or {}

    def save(self, state_dict: dict, path: Path) -> None:
        layer = parse_layer_file(Path(path).name)
        model = layer_file_tensor_rank(Path(path).name)
        prefix = self.prefixes.get(layer, "")
        metadata = self.out.record("layer", placed=False, layer=layer, prefix=prefix,
                                   written_by=self.out.layout.place(), **({"model": model} if model is not None else {}))
        state = {key: value for key, value in state_dict.items() if prefix + key not in self.experts}
        dsaio.save_state_dict(state, path, metadata=metadata)

    def load(self, path: Path) -> dict:
        try:
            state = dsaio.load_state_dict(path)
        except dsaio.CheckpointError as exc:
            raise CheckpointLoadError(f"{path}: {exc}") from None
        prefix = self.prefixes.get(parse_layer_file(Path(path).name), "")
        return {**state, **{name[len(prefix):]: value for name, value in self.experts.items()
                            if prefix and name.startswith(prefix)}}


def layer_prefixes(pipe: Any) -> dict[int, str]:
    """{global layer index: the name its state has in the pipeline module, plus "."} for this rank's layers.
    A layer saves the module behind it: itself, or the tied module a TiedLayerSpec's forward_fn is bound to."""
    names = {id(module): name for name, module in pipe.named_modules()}
    prefixes = {}
    for index, func in pipe.local_layers():
        holder = func.args[0] if isinstance(func, functools.partial) and func.args else func
        if isinstance(holder, torch.nn.Module) and names.get(id(holder)):
            prefixes[index] = names[id(holder)] + "."
    return prefixes


def zero_trained(param: torch.Tensor) -> bool:
    """Whether ZeRO stage 3 keeps `param` in its shards with a master (trained by its optimizer). Parameters
    dszero.Init partitioned that the optimizer does not train (LoRA's frozen base) are partitioned too, but
    have no master: the module file holds them, gathered for the save."""
    unit = getattr(param, "_dszero_unit", None)
    return unit is not None and not unit.partition_only


def untrained_partitioned(param: torch.Tensor) -> bool:
    unit = getattr(param, "_dszero_unit", None)
    return unit is not None and unit.partition_only


def gather_untrained(module: torch.nn.Module, skip: set[str], keep: bool) -> dict[str, torch.Tensor]:
    """{name: whole value} of the module's parameters partitioned by dszero.Init that ZeRO does not train, gathered
    one at a time (collective: every rank of the data group calls it, in the same order); empty unless `keep`
    (only the writing rank keeps copies)."""
    values: dict[str, torch.Tensor] = {}
    first: dict[int, str] = {}  # a tied parameter is gathered once, and kept under each of its names
    for name, param in module.named_parameters(remove_duplicate=False):
        if name in skip or not untrained_partitioned(param):
            continue
        if id(param) not in first:
            first[id(param)] = name
            with dszero.GatheredParameters([param]):
                if keep:
                    values[name] = param.detach().clone()
        elif keep:
            values[name] = values[first[id(param)]]
    return values


def frozen_names(module: torch.nn.Module) -> list[str]:
    """Every state_dict key of a parameter with requires_grad False (each name of a shared one)."""
    return sorted(name for name, param in module.named_parameters(remove_duplicate=False) if not param.requires_grad)


class ModuleWeights:
    holds_tensors: ClassVar[bool] = True

    def __init__(self, layout: RunLayout, *, partitioned: bool, exclude_frozen: bool = False):
        self.layout = layout
        self.module = layout.module
        self.partitioned = partitioned  # ZeRO stage 3: the trained parameters live in its shards
        self.exclude_frozen = exclude_frozen

    def _experts(self) -> dict[str, torch.Tensor]:
        """This rank's expert entries of the module's state, by full name (saved in files of their own)."""
        names = expert_state_names(self.module)
        return {name: value for name, value in self.module.state_dict().items() if name in names}

    def _sharded_names(self) -> set[str]:
        if not self.partitioned:
            return set()
        return {name for name, p in self.module.named_parameters(remove_duplicate=False) if zero_trained(p)}

    # ------------------------------------------------------------------------------------------ save
    def save(self, out: SaveTarget) -> None:
        excluded = frozen_names(self.module) if self.exclude_frozen else []
        if excluded:
            out.common[EXCLUDED_FROZEN] = excluded
        else:
            kept_frozen = frozen_names(self.module)
            if kept_frozen:  # zero_to_fp32 gives them back with the trained ones, as DeepSpeed's does
                out.common[FROZEN_PARAMS] = kept_frozen
        shared = shared_parameter_names(self.module)
        if shared:  # zero_to_fp32 gives tied weights every name the module's state dict has
            out.common[SHARED_PARAMS] = shared
        if self.partitioned:
            out.common[SHARDED_DTYPES] = {name: str(p.dtype) for name, p in
                                          self.module.named_parameters(remove_duplicate=False) if zero_trained(p)}
        pipe = self.layout.pipe
        if pipe is not None:
            files = LayerFiles(out, layer_prefixes(pipe), self._experts())
            tensor_rank = self.layout.tensor.tp_rank if self.layout.tensor is not None else 0

            def write_layers() -> None:
                pipe.save_state_dict(out.top, files, exclude_frozen_params=self.exclude_frozen)
                save_expert_files(self.module, out.top, lambda layer, expert: out.record(
                    "expert", placed=False, moe_layer=layer, expert=expert), layer_ids=self.layout.moe_layer_ids,
                    tensor_rank=tensor_rank)

            out.write(write_layers)
            return

        def write() -> None:
            # Frozen weights dszero.Init partitioned: whole in the file, gathered by every rank of the data group.
            untrained = gather_untrained(self.module, set(excluded), keep=out.writes_shard_files)
            if out.writes_shard_files:
                left_out = self._sharded_names() | set(excluded) | expert_state_names(self.module)
                state = {k: v.detach().contiguous() for k, v in self.module.state_dict().items() if k not in left_out}
                state.update(untrained)
                dsaio.save_state_dict(state, out.directory / MODEL_FILE, metadata=out.record("module"))
            if not self.partitioned:  # at stage 3 the experts are ZeRO's, saved partition-natively in its shards
                save_expert_files(self.module, out.directory,
                                  lambda layer, expert: out.record("expert", moe_layer=layer, expert=expert))

        out.write(write)

    # ------------------------------------------------------------------------------------------ read whole
    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        """Every saved tensor of the module, whole (after OptimizerState.read: stage 3's are its masters)."""
        layout = saved.layout
        plan = layout.plan(saved.path)
        by_name: dict[str, dict[int, torch.Tensor]] = {}  # name -> {tensor rank: its cut}
        if layout.pipe is not None:
            for relative, record in saved.records.items():
                if record.get("kind") == "layer":
                    prefix = record.get("prefix")
                    if not isinstance(prefix, str):
                        raise CheckpointLoadError(f"{saved.path / relative}: its record names no prefix")
                    tensor_rank = record.get("model") or 0
                    for name, tensor in dsaio.load_state_dict(saved.path / relative).items():
                        by_name.setdefault(prefix + name, {})[tensor_rank] = tensor
            whole.module.update(read_expert_files([saved.path], layout.stacked))  # a pipeline's: at the top
        else:
            directories = saved.directories()
            for place, directory in directories:
                for name, tensor in dsaio.load_state_dict(directory / MODEL_FILE).items():
                    by_name.setdefault(name, {})[place.get("tp", [0])[0]] = tensor
            whole.module.update(read_expert_files([directory for _, directory in directories], layout.stacked))
        whole.module.update({name: layout.merge(name, shards, plan) for name, shards in by_name.items()})
        dtypes = saved.common.get(SHARDED_DTYPES) or {}
        if not isinstance(dtypes, dict) or not all(value in _DTYPES for value in dtypes.values()):
            raise CheckpointLoadError(f"{saved.path}: {SHARDED_DTYPES} must map parameter names to "
                                      f"{sorted(_DTYPES)}")
        for name, dtype in dtypes.items():
            master = whole.parameters.get(name, {}).get(MASTER)
            if master is None:
                raise CheckpointLoadError(f"{saved.path}: {name} was kept by ZeRO stage 3 but its shards hold no "
                                          f"master weights for it")
            whole.module[name] = master.to(_DTYPES[dtype])
        whole.left_out = saved.left_out

    # ------------------------------------------------------------------------------------------ load
    def load(self, source: LoadSource, options: LoadOptions) -> None:
        if options.custom_load_fn is not None and self.layout.tensor is not None:
            raise DstrainError("load_checkpoint(custom_load_fn=...) with tensor parallelism: the saved module is cut "
                               "over the tensor ranks; load without custom_load_fn")
        if source.same_layout:
            self._load_own(source.saved, options)
        elif options.custom_load_fn is not None:
            self._custom(dict(source.whole.module), options.custom_load_fn)
        else:
            apply_module_state(self.layout, source.whole.module, strict=options.module_strict,
                               left_out=set(source.whole.left_out), gathered=self.partitioned,
                               where=source.whole.path)
            if self.layout.pipe is not None:
                self.layout.pipe.synchronize_tied_weights()

    def _load_own(self, saved: SavedCheckpoint, options: LoadOptions) -> None:
        pipe = self.layout.pipe
        if pipe is not None:
            from dspipe import PipelineError

            try:
                pipe.load_state_dir(saved.path, LayerFiles(prefixes=layer_prefixes(pipe), experts=self._experts()),
                                    strict=options.module_strict)
            except PipelineError as exc:
                raise CheckpointLoadError(str(exc)) from None
            load_expert_files(self.module, saved.path, options.module_strict, layer_ids=self.layout.moe_layer_ids)
            return
        directory = saved.directory_of(self.layout.place())
        if options.custom_load_fn is not None:
            src = dsaio.load_state_dict(directory / MODEL_FILE)
            if self.partitioned:  # the trained parameters, in fp32 from ZeRO's shards
                src = {**dszero.get_fp32_state_dict_from_zero_checkpoint(directory / ZERO_DIR), **src}
            self._custom(src, options.custom_load_fn)
            return
        self._load_module_file(directory, set(saved.left_out), options.module_strict)
        if not self.partitioned:  # stage 3: ZeRO loads the experts with the other trained parameters
            load_expert_files(self.module, directory, options.module_strict)

    def _load_module_file(self, directory: Path, left_out: set[str], strict: bool) -> None:
        path = directory / MODEL_FILE
        saved = dsaio.load_state_dict(path)
        current = self.module.state_dict()
        partitioned = {name: p for name, p in self.module.named_parameters(remove_duplicate=False)
                       if untrained_partitioned(p)}  # each rank keeps its piece of the file's whole value
        # What the file should hold: not the shards' parameters, those the save left out, nor the experts.
        expected = set(current) - self._sharded_names() - left_out - expert_state_names(self.module)
        missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
        if strict and (missing or unexpected):
            raise CheckpointLoadError(f"{path} does not match the model: missing {_few(missing)}, unexpected "
                                      f"{_few(unexpected)} (load_module_strict=False loads the keys that match)")
        with torch.no_grad():
            for name, value in saved.items():
                if name in partitioned:
                    param = partitioned[name]
                    if full_shape(param) != tuple(value.shape):
                        raise CheckpointLoadError(f"{path}: {name} has shape {tuple(value.shape)} in the checkpoint "
                                                  f"but {full_shape(param)} in the model")
                    param._dszero_unit.store_whole(param, value)
                elif name in current:
                    if current[name].shape != value.shape:
                        raise CheckpointLoadError(f"{path}: {name} has shape {tuple(value.shape)} in the checkpoint "
                                                  f"but {tuple(current[name].shape)} in the model")
                    current[name].copy_(value)

    def _custom(self, src: dict[str, torch.Tensor], load_fn: Callable[..., Any]) -> None:
        """DeepSpeed's custom_load_fn(src=<the saved module state>, dst=<the module>), in place of the module's
        own loading, with the parameters gathered; the first rank's result is kept on every rank."""
        with dszero.GatheredParameters(list(self.module.parameters()), modifier_rank=0):
            load_fn(src=src, dst=self.module)


def apply_module_state(layout: RunLayout, tensors: dict[str, torch.Tensor], *, strict: bool, left_out: set[str],
                       gathered: bool, where: str) -> None:
    """Copy whole tensors into `layout.module`, each cut for this rank (`gathered`: stage 3, whose
    parameters are gathered for the copy and partitioned again after)."""
    module = layout.module
    with dszero.GatheredParameters(list(module.parameters()), modifier_rank=0, enabled=gathered), torch.no_grad():
        targets = module.state_dict(keep_vars=True)  # what a checkpoint holds: no non-persistent buffers
        missing = sorted(set(targets) - set(tensors) - left_out)
        if strict and missing:
            raise CheckpointLoadError(f"{where or 'the checkpoint'} does not hold {_few(missing)} "
                                      f"(load_module_strict=False loads the rest)")
        values = {name: layout.cut(name, tensors[name]) for name in targets if name in tensors}
        for name, value in values.items():  # every shape checked before anything is copied
            if tuple(value.shape) != tuple(targets[name].shape):
                raise CheckpointLoadError(f"{where}: {name} is {tuple(value.shape)} for this rank's layout, but the "
                                          f"model holds {tuple(targets[name].shape)}; nothing was loaded")
        for name, value in values.items():
            targets[name].data.copy_(value.to(targets[name].dtype))


def _few(names: list[str]) -> str:
    return f"{names[:5]}{'...' if len(names) > 5 else ''}"
