"""How a run's tensors lie across its ranks, as checkpoints see it: tensor parallelism, the pipeline and
experts are layouts of the same parts, not parts of their own.

- data parallel: ZeRO's shards over the data group (dszero reshards them at any data-parallel size);
- tensor parallel (dstp): each tensor rank holds its cut of the sharded weights; its files live in
  `tp_RR_of_SS/`, and a whole tensor is the saved shards merged by the saved plan (`SavedLayout.merge`),
  this rank's piece the whole cut by the current plan (`RunLayout.cut`);
- pipeline (dspipe): each stage holds its layers under their global names; its ZeRO shards and rank
  files live in `pipe_RR_of_SS/`, its weights in per-layer files that any number of stages reads;
- experts (dsmoe, AutoEP): experts.py.

A checkpoint records its layout (`RunLayout.describe`) in the common file; loading compares it with the
run's (`RunLayout.matches`): the same, and each rank reads its own files; another, and the checkpoint
is read whole and cut anew (whole.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import CheckpointLoadError
from ..wiring.across_stages import across_stages
from ..wiring.dspipe import is_pipeline_module
from ..wiring.optional_libs import LazyLibrary, imported
from .experts import StackedExperts, autoep_layers, moe_layers, saved_stacked
from .files import stage_directory, tp_directory

if TYPE_CHECKING:
    from ..engine.parts import TrainingParts

# dstp is optional: a model is tensor-parallel only once dstp is imported.
dstp = LazyLibrary("dstp", "a tensor-parallel checkpoint")

MAX_DEGREE = 1 << 16  # a tensor- or pipeline-parallel degree read from a checkpoint is at most this


def tensor_state(module: torch.nn.Module) -> Any:
    """dstp's record of how `module` is cut over its tensor ranks, or None (not tensor-parallel)."""
    if not imported("dstp"):
        return None
    state = dstp.state_of(module)
    return state if state is not None and state.tp_size > 1 else None


def pipeline_shape(module: Any) -> dict[str, Any]:
    layout = module.placement
    return {"ranks": layout.ranks, "stages": layout.stages, "shape": layout.shape, "boundaries": list(module.parts)}


@dataclass
class RunLayout:
    """Where this rank sits in the run, and how its module's tensors are cut."""

    module: torch.nn.Module
    global_rank: int
    dp_rank: int
    dp_size: int
    dp_group: Any
    world_group: Any  # every rank of the run (None: the default group)
    zero_stage: int
    tensor: Any = None  # dstp.TensorParallelModel, when the module is cut over tensor ranks
    pipe: Any = None  # the PipelineModule, when the run is a pipeline
    stacked: StackedExperts = field(default_factory=lambda: StackedExperts({}))
    # A pipeline of several stages: what the whole model holds, each stage's gathered (every stage's AutoEP
    # weights; each MoE layer's id in the whole model's order, for its expert files). None: this rank's.
    model_stacked: dict[str, dict[str, Any]] | None = None
    moe_layer_ids: MoELayerIds | None = None

    @classmethod
    def of(cls, parts: TrainingParts) -> RunLayout:
        """The layout of the run of `parts` (collective for a pipeline of several stages: every rank calls it)."""
        module = parts.module
        layout = cls(module=module, global_rank=parts.global_rank, dp_rank=parts.dp_rank,
                     dp_size=parts.dp_world_size, dp_group=parts.data_parallel_group,
                     world_group=parts.groups.world if parts.groups else None,
                     zero_stage=parts.config.zero_optimization.stage, tensor=tensor_state(module),
                     pipe=module if is_pipeline_module(module) else None, stacked=StackedExperts.of(module))
        if layout.pipe is not None:  # gathered over the stages when there are several
            layout.model_stacked, layout.moe_layer_ids = _whole_pipeline(layout, parts.groups)
        return layout

    def stacked_description(self) -> dict[str, dict[str, Any]]:
        """Every AutoEP stacked weight of the model (every stage's), as a checkpoint records them."""
        return self.stacked.describe() if self.model_stacked is None else self.model_stacked

    @classmethod
    def of_module(cls, module: torch.nn.Module) -> RunLayout:
        """A module trained by no engine (a teacher): no data parallelism, its own tensor and expert cuts."""
        return cls(module=module, global_rank=dist.get_rank() if dist.is_initialized() else 0, dp_rank=0, dp_size=1,
                   dp_group=None, world_group=None, zero_stage=0, tensor=tensor_state(module),
                   stacked=StackedExperts.of(module))

    def place(self) -> dict[str, list[int]]:
        """This rank's coordinates in the layouts that give it a directory of its own."""
        place = {}
        if self.tensor is not None:
            place["tp"] = [self.tensor.tp_rank, self.tensor.tp_size]
        if self.pipe is not None:
            place["pipe"] = [self.pipe.stage_id, self.pipe.num_stages]
        return place

    def shard_directory(self, top: Path) -> Path:
        """Where this rank's files go in a checkpoint at `top`."""
        return place_directory(top, self.place())

    def describe(self) -> dict[str, Any]:
        """The layout as the common file records it."""
        return {"tp": {"size": self.tensor.tp_size, "plan": self.tensor.plan.to_json()} if self.tensor else None,
                "pipe": pipeline_shape(self.pipe) if self.pipe is not None else None,
                "dp_size": self.dp_size, "zero_stage": self.zero_stage, "autoep": self.stacked_description() or None}

    def matches(self, saved: SavedLayout) -> bool:
        """Whether each rank can read its own files of a checkpoint saved at `saved` (ZeRO reshards over the
        data-parallel size itself): the same tensor cut, pipeline, stage-3-or-not and AutoEP expert layout."""
        plan = self.tensor.plan.to_json() if self.tensor is not None else None
        stacked = self.stacked_description()
        return (plan == saved.plan_json and (pipeline_shape(self.pipe) if self.pipe is not None else None) == saved.pipe
                and (self.zero_stage == 3) == (saved.zero_stage == 3) and stacked == saved.stacked
                and (not stacked or self.dp_size == saved.dp_size))  # AutoEP slices share names across groups

    def cut(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the whole tensor `name`: its experts of a stacked AutoEP weight, its cut of a
        tensor-parallel weight, else the tensor itself."""
        value = self.stacked.cut(name, whole)
        if self.tensor is not None:
            plan = self.tensor.plan.params.get(name)
            if plan is not None and plan.sharded:
                value = dstp.shard_tensor(value, plan, self.tensor.tp_rank, self.tensor.tp_size)
        return value


@dataclass(frozen=True)
class MoELayerIds:
    """Each MoE layer's id in the whole model's order ({module name: id}), dsmoe's and AutoEP's apart, as each
    numbers its expert files."""

    dsmoe: dict[str, int]
    autoep: dict[str, int]


def _whole_pipeline(layout: RunLayout, groups: Any) -> tuple[dict[str, dict[str, Any]], MoELayerIds]:
    """(every stage's AutoEP weights, the MoE layer ids over every stage), gathered over the pipe group."""
    module = layout.module
    mine = {"stacked": layout.stacked.describe(), "dsmoe": [name for name, _ in moe_layers(module)],
            "autoep": [name for name, _ in autoep_layers(module)]}
    stages = across_stages(mine, module, groups)
    stacked = {name: entry for stage in stages for name, entry in stage["stacked"].items()}

    def numbered(kind: str) -> dict[str, int]:
        names = sorted({name for stage in stages for name in stage[kind]}, key=_pipeline_order)
        return {name: index for index, name in enumerate(names)}

    return stacked, MoELayerIds(numbered("dsmoe"), numbered("autoep"))


def _pipeline_order(name: str) -> tuple[int, str]:
    """A PipelineModule's module names in layer order: its layers are registered under their layer index."""
    head = name.split(".", 1)[0]
    return (int(head), name) if head.isdigit() else (MAX_DEGREE * MAX_DEGREE, name)


def place_directory(top: Path, place: dict[str, list[int]]) -> Path:
    directory = top
    if "tp" in place:
        directory = directory / tp_directory(*place["tp"])
    if "pipe" in place:
        directory = directory / stage_directory(*place["pipe"])
    return directory


@dataclass(frozen=True)
class SavedLayout:
    """A checkpoint's layout, read back from its common file (checked: the file may be crafted)."""

    tp_size: int
    plan_json: str | None
    pipe: dict[str, Any] | None
    dp_size: int
    zero_stage: int
    stacked: dict[str, dict[str, int]]

    @classmethod
    def from_description(cls, raw: Any, where: Path) -> SavedLayout:
        if not isinstance(raw, dict):
            raise CheckpointLoadError(f"{where}: the checkpoint records no layout")
        tp = raw.get("tp")
        tp_size, plan_json = 1, None
        if tp is not None:
            tp_size = tp.get("size") if isinstance(tp, dict) else tp
            if not _degree(tp_size) or not isinstance(tp, dict) or not isinstance(tp.get("plan"), str):
                raise CheckpointLoadError(f"{where}: tp_size = {tp_size!r} is not a tensor-parallel degree "
                                          f"(1..{MAX_DEGREE}) with a plan")
            plan_json = tp["plan"]
        pipe = raw.get("pipe")
        if pipe is not None and not (isinstance(pipe, dict) and _degree(pipe.get("ranks"))
                                     and _degree(pipe.get("stages"))):
            raise CheckpointLoadError(f"{where}: the pipeline entry {pipe!r} is malformed")
        dp_size, zero_stage = raw.get("dp_size"), raw.get("zero_stage")
        if not _degree(dp_size) or zero_stage not in (0, 1, 2, 3):
            raise CheckpointLoadError(f"{where}: dp_size {dp_size!r} / zero_stage {zero_stage!r} are malformed")
        return cls(tp_size, plan_json, pipe, dp_size, zero_stage, saved_stacked(raw.get("autoep"), where))

    def places(self) -> list[dict[str, list[int]]]:
        """Every directory-owning place of the saved run, in rank order (tensor rank outermost)."""
        tps = [{"tp": [r, self.tp_size]} for r in range(self.tp_size)] if self.tp_size > 1 else [{}]
        if self.pipe is None:
            return tps
        return [{**tp, "pipe": [r, self.pipe["ranks"]]} for tp in tps for r in range(self.pipe["ranks"])]

    def directories(self, path: Path) -> list[tuple[dict[str, list[int]], Path]]:
        found = [(place, place_directory(path, place)) for place in self.places()]
        missing = [str(d.relative_to(path)) for _, d in found if not d.is_dir()]
        if missing:
            raise CheckpointLoadError(f"{path}: saved as {len(found)} rank directories but {missing[:4]} are missing")
        return found

    def plan(self, where: Path) -> Any:
        if self.plan_json is None:
            return None
        try:
            return dstp.TensorParallelPlan.from_json(self.plan_json)
        except dstp.TensorParallelError as exc:
            raise CheckpointLoadError(f"{where}: {exc}") from None

    def merge(self, name: str, by_tensor_rank: dict[int, torch.Tensor], plan: Any) -> torch.Tensor:
        """The whole tensor `name` from the saved tensor ranks' pieces (`plan`: self.plan()); AutoEP experts
        split over the tensor ranks are stacked in tensor-rank order."""
        if self.stacked.get(name, {}).get("over") == "tensor":
            if sorted(by_tensor_rank) != list(range(self.tp_size)):
                raise CheckpointLoadError(f"{name}: experts saved by tensor ranks {sorted(by_tensor_rank)} of "
                                          f"{self.tp_size}")
            return torch.cat([by_tensor_rank[r] for r in range(self.tp_size)])
        pp = plan.params.get(name) if plan is not None else None
        if pp is None or not pp.sharded:
            return next(iter(by_tensor_rank.values()))
        if sorted(by_tensor_rank) != list(range(self.tp_size)):
            raise CheckpointLoadError(f"{name}: saved by tensor ranks {sorted(by_tensor_rank)} of {self.tp_size}")
        return dstp.merge_shards([by_tensor_rank[r] for r in range(self.tp_size)], pp)


def _degree(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DEGREE
