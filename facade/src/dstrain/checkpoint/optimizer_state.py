"""ZeRO's optimizer state as a checkpoint part: fp32 master weights, per-element state (Adam's moments),
per-group scalars (the step), the loss scaler and the skipped steps.

Each rank directory holds `zero/`, dszero's sharded checkpoint over that directory's data group (each
shard recording this save, dszero.checkpoint.recording). At the same layout ZeRO loads it at any
data-parallel size itself. At another layout (tensor degree, pipeline stages, AutoEP expert layout,
stage 3 or not) every parameter's state is read whole (dszero.checkpoint.read_parameter_states over
every rank directory, merged by the saved layout) and cut into this run's shards by
`dszero.checkpoint.load_parameter_states`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

import dszero
from dszero.checkpoint import load_parameter_states, read_meta, read_parameter_states, recording

from ..errors import CheckpointLoadError
from .contents import MASTER
from .experts import whole_stacked_states
from .files import ZERO_DIR

if TYPE_CHECKING:
    from .contents import WholeCheckpoint
    from .layout import RunLayout
    from .protocol import LoadOptions, LoadSource, SaveTarget
    from .saved import SavedCheckpoint


class OptimizerState:
    holds_tensors: ClassVar[bool] = True

    def __init__(self, zero: dszero.ZeroOptimizer | None, layout: RunLayout):
        self.zero = zero
        self.layout = layout

    def save(self, out: SaveTarget) -> None:
        def write() -> None:
            with recording(out.record_of("zero")):  # every shard and zero_meta.json say which save they are
                self.zero.save(out.directory / ZERO_DIR, node_local=out.node_local)

        if self.zero is not None:
            out.write(write)

    @staticmethod
    def read(saved: SavedCheckpoint, whole: WholeCheckpoint) -> None:
        layout = saved.layout
        plan = layout.plan(saved.path)
        by_name: dict[str, dict[str, dict[int, torch.Tensor]]] = {}  # name -> kind -> {tensor rank: piece}
        meta: dict[str, Any] | None = None
        for place, directory in saved.directories():
            zero_dir = directory / ZERO_DIR
            try:
                states, scalars = read_parameter_states(zero_dir)
                if layout.stacked:  # AutoEP: each expert group's slices put back together by expert
                    states.update(whole_stacked_states(zero_dir, layout.stacked, some=layout.pipe is not None))
                meta = meta or read_meta(zero_dir)
            except dszero.CheckpointError as exc:
                raise CheckpointLoadError(f"cannot read checkpoint: {exc}") from None
            whole.scalars = whole.scalars or dict(scalars)
            tensor_rank = place.get("tp", [0])[0]
            for name, kinds in states.items():  # a weight tied across pipeline stages: the first stage's copy
                for kind, tensor in kinds.items():
                    by_name.setdefault(name, {}).setdefault(kind, {}).setdefault(tensor_rank, tensor)
        whole.parameters = {name: {kind: layout.merge(name, pieces, plan) for kind, pieces in kinds.items()}
                            for name, kinds in by_name.items()}
        if meta is not None:
            whole.param_groups = [dict(group) for group in meta.get("param_groups", []) if isinstance(group, dict)]
            whole.loss_scaler = meta.get("scaler")
            whole.progress["skipped_steps"] = int(meta.get("skipped_steps", 0))

    def load(self, source: LoadSource, options: LoadOptions) -> None:
        if self.zero is None:
            return
        try:
            if source.same_layout:
                self._load_own(source.saved, options)
            else:
                self._load_whole(source.whole, options)
        except dszero.CheckpointError as exc:
            raise CheckpointLoadError(f"cannot load checkpoint: {exc}") from None

    def _load_own(self, saved: SavedCheckpoint, options: LoadOptions) -> None:
        zero = self.zero
        directory = saved.directory_of(self.layout.place()) / ZERO_DIR
        if not options.module_only:
            zero.load(directory, load_optimizer_states=options.optimizer_states)
            if not options.optimizer_states:  # a progress counter, restored with global_steps (Progress)
                zero.skipped_steps = int(read_meta(directory).get("skipped_steps", zero.skipped_steps))
        elif not zero.partitions_parameters:
            zero.masters_from_module()  # the module's weights, just loaded, are the truth
        elif options.custom_load_fn is None:  # stage 3: the weights are ZeRO's (a custom load wrote them through)
            zero.load(directory, load_optimizer_states=False)

    def _load_whole(self, whole: WholeCheckpoint, options: LoadOptions) -> None:
        zero = self.zero
        with_states = options.optimizer_states and not options.module_only
        states: dict[str, dict[str, torch.Tensor]] = {}
        for name, param in self.layout.module.named_parameters(remove_duplicate=False):
            saved = whole.parameters.get(name, {})
            if with_states and saved:
                kinds = saved
            elif MASTER in saved:
                kinds = {MASTER: saved[MASTER]}
            elif name in whole.module:  # a checkpoint without masters: the module's weights become them
                kinds = {MASTER: whole.module[name]}
            else:
                if not zero.partitions_parameters and param.requires_grad:
                    states[name] = {MASTER: param.detach().float().clone()}  # kept as it is (non-strict load)
                continue
            states[name] = {kind: self.layout.cut(name, tensor) for kind, tensor in kinds.items()}
        load_parameter_states(zero, states, whole.scalars if with_states else {}, load_optimizer_states=with_states)
        if with_states:
            _set_hyperparameters(zero.param_groups, whole.param_groups)
            if whole.loss_scaler is not None:
                zero.scaler.load_state_dict(whole.loss_scaler)
        if not options.module_only:  # a progress counter, restored with global_steps (Progress), states or not
            zero.skipped_steps = int(whole.progress.get("skipped_steps", zero.skipped_steps))


def _set_hyperparameters(groups: list[dict[str, Any]], saved: list[dict[str, Any]]) -> None:
    """The saved groups' numeric hyperparameters (lr, betas, weight_decay, ...) onto the optimizer's groups:
    by position when there are as many; else those every saved group agrees on, onto every group (another
    layout may split the parameters into other groups, e.g. tensor-parallel shards beside replicated ones)."""
    if not saved:
        return
    if len(saved) == len(groups):
        pairs = list(zip(groups, saved))
    else:
        shared = {key: value for key, value in saved[0].items() if all(s.get(key) == value for s in saved)}
        pairs = [(group, shared) for group in groups]
    for group, hyper in pairs:
        for key, value in hyper.items():
            if key in group and key != "params" and _numeric(group[key]) and _numeric(value):
                group[key] = tuple(value) if isinstance(group[key], tuple) else value


def _numeric(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_numeric(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)
