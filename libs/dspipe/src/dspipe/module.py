"""`PipelineModule`: DeepSpeed's model API for pipelines. A list of layers (modules, LayerSpecs,
TiedLayerSpecs or plain functions) is cut into stages; each rank builds only the layers of its stages.

Which stage a rank holds comes from the layout, decided in this order:
1. `topology` when given (a dscomm ProcessTopology or ParallelDims: its pipe axis is num_stages);
2. the layout registered with `dscomm.groups.use()`, when its pipe degree equals num_stages;
3. otherwise the world the module is built in, as DeepSpeed does: ParallelDims(world, pipe=num_stages),
   so a module built before `initialize()` gets the layout initialize() will register. A world of one
   needs no torch.distributed (num_stages 1 only).

Stages are virtual: `chunks` stages per rank looped round the ranks (interleaved schedules; stage s on
rank s % num_stages), or two per rank in a V (`DualPipeVModule`). `num_stages` is always the pipeline
degree (ranks), as in DeepSpeed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dscomm import ParallelDims, ProcessTopology, checkpointing
from dscomm import groups as registry

from . import tied as tying
from .errors import PipelineError
from .layers import LayerSpec, TiedLayerSpec
from .partition import layer_name, partition_layers
from .profiling import profile_layer_times
from .schedules.placement import Placement, make_placement


class PipelineModule(nn.Module):
    """Layers split into pipeline stages; `forward` runs this rank's stage (the engine runs stages one
    micro-batch at a time through `run_stage`). See the module docstring for where the stage comes from.

    Beyond DeepSpeed's arguments: `chunks` stages per rank for interleaved schedules, and `sample_input`,
    the micro-batch `partition_method="profile"` times each layer on.
    """

    placement_shape = "loop"

    def __init__(self, layers: Iterable[Any], num_stages: int | None = None, topology: Any = None,
                 loss_fn: Callable[..., Any] | None = None, seed_layers: bool = False,
                 seed_fn: Callable[[int], Any] | None = None, base_seed: int = 1234,
                 partition_method: str = "parameters", activation_checkpoint_interval: int = 0,
                 activation_checkpoint_func: Callable[..., Any] = checkpointing.checkpoint,
                 checkpointable_layers: list[str] | None = None, dynamic_shape: bool = False, *,
                 chunks: int = 1, sample_input: Any = None):
        super().__init__()
        self.dims, self.global_rank = _layout(num_stages, topology)
        self.num_stages = self.dims.pipe
        self.stage_id = self.dims.coords(self.global_rank).pipe
        self.loss_fn = loss_fn
        self.seed_layers = bool(seed_layers)
        self.seed_fn = seed_fn
        self.base_seed = base_seed
        self.partition_method = partition_method
        self.activation_checkpoint_func = activation_checkpoint_func
        if checkpointable_layers is not None and not isinstance(checkpointable_layers, list):
            raise PipelineError(f"checkpointable_layers must be a list of layer class names, got "
                                f"{type(checkpointable_layers).__name__}")
        self.checkpointable_layers = checkpointable_layers
        self.dynamic_shape = bool(dynamic_shape)
        self.set_checkpoint_interval(activation_checkpoint_interval)
        self._layer_specs = _as_layer_list(layers)
        self._num_layers = len(self._layer_specs)
        self.placement = self._make_placement(chunks)
        self.parts = partition_layers(
            self._layer_specs, self.placement.stages, partition_method,
            parameter_counts=self._count_layer_params,
            profile_times=lambda: profile_layer_times(self._layer_specs, sample_input, partition_method))
        self.local_stages = self.placement.stages_of(self.stage_id)
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self._stage_funcs: dict[int, list[tuple[int, Any]]] = {}
        self._forward_calls = 0
        self._build()
        self.forward_funcs = [func for stage in self.local_stages for _, func in self._stage_funcs[stage]]
        self.tied_comms = tying.tie(self._tied_ranks(), dict(self.tied_modules.items()), self.tied_weight_attrs,
                                    self.dims, self.global_rank)
        tying.broadcast_tied(self.tied_comms)

    # ---------------------------------------------------------------------------------------- layout
    def _make_placement(self, chunks: int) -> Placement:
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise PipelineError(f"chunks (stages per rank) must be an int >= 1, got {chunks!r}")
        return make_placement("loop", self.num_stages, self.num_stages * chunks)

    def _tied_ranks(self) -> dict[str, list[int]]:
        ranks: dict[str, list[int]] = {}
        for index, spec in enumerate(self._layer_specs):
            if isinstance(spec, TiedLayerSpec):
                ranks.setdefault(spec.key, []).append(self.stage_owner(index))
        return ranks

    def _count_layer_params(self) -> list[int]:
        """Trainable parameters per layer, each spec built alone on the meta device (no memory)."""
        counts = []
        for spec in self._layer_specs:
            if isinstance(spec, LayerSpec):
                try:
                    with torch.device("meta"):
                        module = spec.build()
                except Exception:  # a constructor that touches data; build it for real, one at a time
                    module = spec.build()
            elif isinstance(spec, nn.Module):
                module = spec
            else:
                counts.append(0)
                continue
            counts.append(sum(p.numel() for p in module.parameters() if p.requires_grad))
        return counts

    def _build(self) -> None:
        for stage in self.local_stages:
            funcs = []
            for index in range(self.parts[stage], self.parts[stage + 1]):
                spec = self._layer_specs[index]
                if self.seed_layers:
                    self._seed(self.base_seed + index)
                funcs.append((index, self._materialise(index, spec)))
            self._stage_funcs[stage] = funcs

    def _materialise(self, index: int, spec: Any) -> Any:
        if isinstance(spec, PipelineModule):
            raise PipelineError(f"layer {index} is itself a PipelineModule; nest its layers instead")
        if isinstance(spec, TiedLayerSpec):
            if spec.key not in self.tied_modules:
                self.tied_modules[spec.key] = spec.build()
                self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
            module = self.tied_modules[spec.key]
            return module if spec.forward_fn is None else partial(spec.forward_fn, module)
        if isinstance(spec, LayerSpec):
            spec = spec.build()
        if isinstance(spec, nn.Module):
            self.add_module(str(index), spec)
            return spec
        if callable(spec):
            return spec
        raise PipelineError(f"layer {index} is a {type(spec).__name__}; a layer must be a torch.nn.Module, a "
                            f"LayerSpec, a TiedLayerSpec or a callable")

    def _seed(self, seed: int) -> None:
        if self.seed_fn is not None:
            self.seed_fn(seed)
            return
        random.seed(seed)
        # torch.manual_seed also queues a lazy seeding of every device type with its formatted stack in a
        # forked process (milliseconds a call, and the queue grows); seed only the generators in use.
        torch.default_generator.manual_seed(seed)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.manual_seed(seed)

    # ---------------------------------------------------------------------------------------- running
    def forward(self, forward_input: Any) -> Any:
        """This rank's first stage on one micro-batch (DeepSpeed's forward; engines call run_stage)."""
        return self.run_stage(self.local_stages[0], forward_input)

    def run_stage(self, stage: int, inputs: Any) -> Any:
        """Stage `stage`'s layers on `inputs`, with activation checkpointing every
        activation_checkpoint_interval layers."""
        for segment in self.stage_segments(stage):
            inputs = segment.run(inputs)
        return inputs

    def stage_segments(self, stage: int) -> list[Segment]:
        """Stage `stage` cut into pieces that run one after another: the checkpointed blocks when
        activation checkpointing is on, else one piece per layer with parameters (with the parameter-free
        layers after it). A zero-bubble engine splits backward at these cuts."""
        if stage not in self._stage_funcs:
            raise PipelineError(f"rank {self.global_rank} holds stages {list(self.local_stages)}, not stage {stage}")
        funcs = self._stage_funcs[stage]
        self._forward_calls += 1
        offset = self._forward_calls
        interval = self.activation_checkpoint_interval
        if interval > 0:
            blocks = [funcs[i:i + interval] for i in range(0, len(funcs), interval)]
            return [Segment(self._checkpointed(block, offset) if self._is_checkpointable([f for _, f in block])
                            else self._plain(block, offset), _parameters(block)) for block in blocks]
        pieces: list[list[tuple[int, Any]]] = []
        for item in funcs:
            if not pieces or _has_parameters(item[1]):
                pieces.append([item])
            else:
                pieces[-1].append(item)
        return [Segment(self._plain(piece, offset), _parameters(piece)) for piece in pieces]

    def _plain(self, block: list[tuple[int, Any]], offset: int) -> Callable[[Any], Any]:
        def run(inputs: Any) -> Any:
            for index, func in block:
                if self.seed_layers:
                    self._seed(self.base_seed * (offset + 1) + index)
                inputs = func(inputs)
            return inputs

        return run

    def _checkpointed(self, block: list[tuple[int, Any]], offset: int) -> Callable[[Any], Any]:
        plain = self._plain(block, offset)

        def unpacked(*inputs: Any) -> Any:
            return plain(inputs[0] if len(inputs) == 1 else inputs)

        def run(inputs: Any) -> Any:
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            return self.activation_checkpoint_func(unpacked, *args)

        return run

    def _is_checkpointable(self, funcs: list[Any]) -> bool:
        if self.checkpointable_layers is not None:
            return all(type(f).__name__ in self.checkpointable_layers for f in funcs)
        return any(_has_parameters(f) for f in funcs)

    # ---------------------------------------------------------------------------------------- DeepSpeed's API
    def set_checkpoint_interval(self, interval: int) -> None:
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
            raise PipelineError(f"activation_checkpoint_interval must be an int >= 0, got {interval!r}")
        self.activation_checkpoint_interval = interval

    def topology(self) -> ProcessTopology:
        """The layout as DeepSpeed's ProcessTopology (axes pipe, data, model)."""
        return self.dims.to_topology()

    def mpu(self) -> Any:
        """The registered ParallelGroups when they are this module's layout (DeepSpeed's grid), else None."""
        current = registry.current()
        return current if current is not None and current.dims == self.dims else None

    def num_pipeline_stages(self) -> int:
        return self.num_stages

    def partitions(self) -> list[int]:
        """The layer boundaries of every (virtual) stage: stage s holds layers parts[s] .. parts[s+1]-1."""
        return list(self.parts)

    def stage_of_layer(self, layer_idx: int) -> int:
        """The (virtual) stage holding layer `layer_idx`."""
        if not isinstance(layer_idx, int) or not 0 <= layer_idx < self._num_layers:
            raise PipelineError(f"layer index {layer_idx!r} is outside 0..{self._num_layers - 1}")
        for stage in range(self.placement.stages):
            if self.parts[stage] <= layer_idx < self.parts[stage + 1]:
                return stage
        raise PipelineError(f"layer {layer_idx} is in no stage (boundaries {self.parts})")

    def stage_owner(self, layer_idx: int) -> int:
        """The pipeline rank (DeepSpeed's stage id) that builds layer `layer_idx`."""
        return self.placement.rank_of[self.stage_of_layer(layer_idx)]

    def allreduce_tied_weight_gradients(self) -> None:
        """Sum the tied weights' gradients over the ranks holding a copy."""
        tying.reduce_tied_grads(self.tied_comms)

    def synchronize_tied_weights(self) -> None:
        """Copy the tied weights from the lowest rank holding each (after loading weights)."""
        tying.broadcast_tied(self.tied_comms)

    def get_tied_weights_and_groups(self) -> list[tuple[torch.nn.Parameter, Any]]:
        return [(w, t.group) for t in self.tied_comms.values() for w in t.weights]

    def save_state_dict(self, save_dir: Any, checkpoint_engine: Any, exclude_frozen_params: bool = False) -> None:
        """One file per layer, `layer_XX-model_states<suffix>`, written through `checkpoint_engine` (an
        object with save(state_dict, path) and load(path)) by data rank 0 of each stage; with tensor-parallel
        ranks, one per layer and tensor rank, `layer_XX-model_YY-model_states<suffix>` (DeepSpeed's names)."""
        from .checkpoint import save_layers

        save_layers(self, save_dir, checkpoint_engine, exclude_frozen_params=exclude_frozen_params)

    def load_state_dir(self, load_dir: Any, checkpoint_engine: Any, strict: bool = True) -> None:
        """Load this rank's layers from their per-layer files (saved at any number of stages)."""
        from .checkpoint import load_layers

        load_layers(self, load_dir, checkpoint_engine, strict=strict)

    def get_additional_losses(self) -> dict[str, torch.Tensor] | None:
        return None

    def local_layers(self) -> list[tuple[int, Any]]:
        """(global layer index, callable) of every layer this rank holds, in stage order."""
        return [item for stage in self.local_stages for item in self._stage_funcs[stage]]

    def extra_repr(self) -> str:
        return (f"stages={self.placement.stages} on {self.num_stages} rank(s) ({self.placement.shape}), "
                f"this rank {self.global_rank} holds {list(self.local_stages)}, boundaries {self.parts}")


class DualPipeVModule(PipelineModule):
    """A PipelineModule cut into 2 * num_stages stages placed in a V: rank r builds stage r and stage
    2 * num_stages - 1 - r, so rank 0 both loads the data and computes the loss, and layers tied between
    the first and the last stage are one module there. Trained with the "dualpipev" schedule (or "zbv")."""

    placement_shape = "v"

    def _make_placement(self, chunks: int) -> Placement:
        if chunks != 1:
            raise PipelineError(f"DualPipeVModule places two stages per rank in a V; chunks must stay 1, got {chunks}")
        return make_placement("v", self.num_stages, 2 * self.num_stages)


# -------------------------------------------------------------------------------------------- helpers
@dataclass(frozen=True)
class Segment:
    """A run of consecutive layers of one stage (`run(inputs) -> outputs`) and their parameters."""

    run: Callable[[Any], Any]
    params: tuple[nn.Parameter, ...]


def _module_of(func: Any) -> nn.Module | None:
    module = func.args[0] if isinstance(func, partial) and func.args else func
    return module if isinstance(module, nn.Module) else None


def _has_parameters(func: Any) -> bool:
    module = _module_of(func)
    return module is not None and any(True for _ in module.parameters())


def _parameters(block: Sequence[tuple[int, Any]]) -> tuple[nn.Parameter, ...]:
    seen: dict[int, nn.Parameter] = {}
    for _, func in block:
        module = _module_of(func)
        if module is not None:
            for param in module.parameters():
                seen.setdefault(id(param), param)
    return tuple(seen.values())


def _as_layer_list(layers: Iterable[Any]) -> list[Any]:
    if isinstance(layers, nn.Sequential):
        return list(layers.children())
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise PipelineError(f"layers must be a sequence of layers (modules, LayerSpecs, functions), got "
                            f"{type(layers).__name__}")
    specs = list(layers)
    if not specs:
        raise PipelineError("layers is empty: a pipeline needs at least one layer")
    return specs


def _layout(num_stages: int | None, topology: Any) -> tuple[ParallelDims, int]:
    """(the layout, this process's global rank); see the module docstring for the order."""
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if num_stages is not None and (not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1):
        raise PipelineError(f"num_stages must be an int >= 1, got {num_stages!r}")
    if topology is not None:
        if isinstance(topology, ParallelDims):
            dims = topology
        elif isinstance(topology, ProcessTopology):
            dims = ParallelDims.from_topology(topology)
        else:
            raise PipelineError(f"topology must be a dscomm ProcessTopology (PipeDataParallelTopology, ...) or a "
                                f"ParallelDims, got {type(topology).__name__}")
        if num_stages is not None and num_stages != dims.pipe:
            raise PipelineError(f"num_stages={num_stages} but the topology has pipe={dims.pipe}; give one of them")
        if dims.world_size != world:
            raise PipelineError(f"the topology is for {dims.world_size} ranks ({dims}) but the world has {world}")
        return dims, rank
    if num_stages is None:
        raise PipelineError("PipelineModule needs num_stages= or topology=")
    current = registry.current()
    if current is not None and current.dims.pipe == num_stages:
        return current.dims, rank
    if world % num_stages:
        where = "" if distributed else (" (torch.distributed is not initialised, so this is a world of one: call "
                                        "dstrain.init_distributed() before building the module)")
        raise PipelineError(f"num_stages={num_stages} must divide the world size {world}{where}")
    return ParallelDims(world, pipe=num_stages), rank


__all__ = ["DualPipeVModule", "PipelineModule", "Segment", "layer_name"]
