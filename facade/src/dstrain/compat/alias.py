"""Module aliases: one import path served by another module, the same module object under both names.

Two tables use it:
- `MAPPED_PATHS`: `deepspeed.<path>` -> dstrain's module, registered by `import dstrain.as_deepspeed`
  (and by the launcher in its ranks). A `deepspeed.` path outside the table is an ImportError that
  says so; a path whose library is not installed names the `pip install` line.
- `PUBLIC_PATHS`: the DeepSpeed-shaped public names under `dstrain.` (`dstrain.zero`, `dstrain.comm`,
  `dstrain.pipe`, `dstrain.moe`, `dstrain.runtime`, ...), whose modules live in this `compat`
  package; registered by `import dstrain`, so `from dstrain.moe.layer import MoE` keeps working.

A library behind a mapped path (`dspipe` for `deepspeed.pipe`, `dstrain` itself for `deepspeed`) that a
module of the same name beside the script would stand in for (`python script.py` puts the script's folder
first on sys.path) is an ImportError naming that file, not a confusing failure inside dstrain, nor a
user's module silently used as dstrain's.

This module imports nothing but the standard library: the launcher registers it before torch loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

_C = "dstrain.compat"

# deepspeed.<path> -> the module that provides it (dstrain's public names: those under PUBLIC_PATHS resolve
# once more, into this package). Every entry is importable where its library is installed.
MAPPED_PATHS: dict[str, str] = {
    "deepspeed": "dstrain",
    "deepspeed.accelerator": "dstrain.accelerator",
    "deepspeed.accelerator.cpu_accelerator": "dstrain.accelerator.cpu_accelerator",
    "deepspeed.accelerator.cuda_accelerator": "dstrain.accelerator.cuda_accelerator",
    "deepspeed.git_version_info": f"{_C}.git_version_info",
    "deepspeed.comm": "dstrain.comm",
    "deepspeed.zero": "dstrain.zero",
    "deepspeed.checkpointing": "dstrain.checkpointing",
    "deepspeed.checkpoint": f"{_C}.checkpoint",
    "deepspeed.checkpoint.utils": f"{_C}.checkpoint.utils",
    "deepspeed.checkpoint.constants": f"{_C}.checkpoint.constants",
    "deepspeed.checkpoint.ds_to_universal": "dstrain.checkpoint.ds_to_universal",
    "deepspeed.runtime": "dstrain.runtime",
    "deepspeed.runtime.activation_checkpointing": "dstrain.runtime",
    "deepspeed.runtime.activation_checkpointing.checkpointing": "dstrain.checkpointing",
    "deepspeed.runtime.config": "dstrain.runtime.config",
    "deepspeed.runtime.constants": "dstrain.runtime.constants",
    "deepspeed.runtime.precision_config": "dstrain.runtime.precision_config",
    "deepspeed.runtime.dataloader": "dstrain.runtime.dataloader",
    "deepspeed.runtime.engine": "dstrain.engine",
    "deepspeed.runtime.lr_schedules": "dstrain.runtime.lr_schedules",
    "deepspeed.runtime.utils": "dstrain.runtime.utils",
    "deepspeed.runtime.zero": "dstrain.runtime.zero",
    "deepspeed.runtime.zero.offload_config": "dstrain.runtime.zero.offload_config",
    "deepspeed.runtime.zero.config": "dstrain.runtime.zero.config",
    "deepspeed.runtime.zero.leaf_module_config": "dstrain.runtime.zero.leaf_module_config",
    "deepspeed.runtime.zero.partition_parameters": "dszero.partition_parameters",
    "deepspeed.runtime.zero.stage_1_and_2": "dstrain.runtime.zero.stage_1_and_2",
    "deepspeed.runtime.zero.stage3": "dstrain.runtime.zero.stage3",
    "deepspeed.runtime.checkpoint_engine": f"{_C}.runtime.checkpoint_engine",
    "deepspeed.runtime.checkpoint_engine.checkpoint_engine": f"{_C}.runtime.checkpoint_engine.checkpoint_engine",
    "deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine":
        f"{_C}.runtime.checkpoint_engine.torch_checkpoint_engine",
    "deepspeed.runtime.zero.utils": "dstrain.runtime.zero.utils",
    "deepspeed.runtime.fp16": "dstrain.runtime.fp16",
    "deepspeed.runtime.fp16.fused_optimizer": "dstrain.runtime.fp16.fused_optimizer",
    "deepspeed.runtime.fp16.unfused_optimizer": "dstrain.runtime.fp16.unfused_optimizer",
    "deepspeed.runtime.bf16_optimizer": "dstrain.runtime.bf16_optimizer",
    "deepspeed.utils": "dstrain.utils",
    "deepspeed.utils.groups": "dscomm.groups",
    "deepspeed.utils.zero_to_fp32": "dstrain.utils.zero_to_fp32",
    "deepspeed.utils.torch": "dstrain.utils.torch",
    "deepspeed.utils.numa": "dstrain.utils.numa",
    "deepspeed.utils.logging": "dstrain.utils.logging",
    "deepspeed.utils.z3_leaf_module": "dszero.leaf_modules",
    "deepspeed.ops": "dstrain.ops",
    "deepspeed.ops.adam": "dstrain.ops.adam",
    "deepspeed.ops.adagrad": "dstrain.ops.adagrad",
    "deepspeed.ops.lion": "dstrain.ops.lion",
    "deepspeed.ops.aio": "dstrain.ops.aio",
    "deepspeed.ops.op_builder": "dstrain.ops.op_builder",
    "deepspeed.ops.lamb": "dstrain.ops",
    "deepspeed.ops.transformer": "dstrain.ops.transformer",
    "deepspeed.monitor": "dsmonitor",
    "deepspeed.monitor.monitor": f"{_C}.monitor.monitor",
    "deepspeed.monitor.config": f"{_C}.monitor.config",
    "deepspeed.monitor.tensorboard": f"{_C}.monitor.tensorboard",
    "deepspeed.monitor.wandb": f"{_C}.monitor.wandb",
    "deepspeed.monitor.csv_monitor": f"{_C}.monitor.csv_monitor",
    "deepspeed.monitor.comet": f"{_C}.monitor.comet",
    "deepspeed.profiling": f"{_C}.profiling",
    "deepspeed.profiling.flops_profiler": "dsmonitor.profiler",
    "deepspeed.profiling.flops_profiler.profiler": "dsmonitor.profiler.profiler",
    "deepspeed.launcher": f"{_C}.launcher",
    "deepspeed.launcher.runner": f"{_C}.launcher.runner",
    "deepspeed.launcher.multinode_runner": f"{_C}.launcher.multinode_runner",
    "deepspeed.elasticity": f"{_C}.elasticity",
    "deepspeed.elasticity.config": f"{_C}.elasticity.config",
    "deepspeed.compression": f"{_C}.compression",
    "deepspeed.compression.helper": f"{_C}.compression.helper",
    "deepspeed.pipe": "dstrain.pipe",
    "deepspeed.moe": "dstrain.moe",
    "deepspeed.moe.layer": "dstrain.moe.layer",
    "deepspeed.moe.utils": "dstrain.moe.utils",
    "deepspeed.moe.sharded_moe": "dstrain.moe.sharded_moe",
    "deepspeed.moe.experts": "dstrain.moe.experts",
    "deepspeed.module_inject": f"{_C}.module_inject",
    "deepspeed.module_inject.auto_ep_layer": f"{_C}.module_inject.auto_ep_layer",
    "deepspeed.runtime.pipe": "dstrain.pipe",
    "deepspeed.runtime.pipe.module": "dstrain.pipe",
    "deepspeed.runtime.pipe.topology": "dstrain.runtime.pipe_topology",
    "deepspeed.runtime.pipe.schedule": "dspipe.schedules.steps",
    # data efficiency (dsdata)
    "deepspeed.runtime.data_pipeline": "dstrain.runtime.data_pipeline",
    "deepspeed.runtime.data_pipeline.curriculum_scheduler": "dstrain.runtime.data_pipeline.curriculum_scheduler",
    "deepspeed.runtime.data_pipeline.data_sampling": "dstrain.runtime.data_pipeline.data_sampling",
    "deepspeed.runtime.data_pipeline.data_sampling.data_analyzer": "dstrain.runtime.data_pipeline.data_sampling.data_analyzer",
    "deepspeed.runtime.data_pipeline.data_sampling.data_sampler": "dstrain.runtime.data_pipeline.data_sampling.data_sampler",
    "deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset": "dstrain.runtime.data_pipeline.data_sampling.indexed_dataset",
    "deepspeed.runtime.data_pipeline.data_routing": "dstrain.runtime.data_pipeline.data_routing",
    "deepspeed.runtime.data_pipeline.data_routing.helper": "dstrain.runtime.data_pipeline.data_routing.helper",
    "deepspeed.runtime.data_pipeline.data_routing.basic_layer": "dstrain.runtime.data_pipeline.data_routing.basic_layer",
    "deepspeed.runtime.data_pipeline.data_routing.scheduler": "dstrain.runtime.data_pipeline.data_routing.scheduler",
    # AutoTP (dstp)
    "deepspeed.runtime.tensor_parallel": "dstrain.runtime.tensor_parallel",
    "deepspeed.runtime.tensor_parallel.config": "dstrain.runtime.tensor_parallel.config",
    # Ulysses sequence parallelism (dsseq)
    "deepspeed.sequence": "dstrain.sequence",
    "deepspeed.sequence.layer": "dstrain.sequence.layer",
    "deepspeed.runtime.sequence_parallel": "dstrain.runtime.sequence_parallel",
    "deepspeed.runtime.sequence_parallel.ulysses_sp": "dstrain.runtime.sequence_parallel.ulysses_sp",
    "deepspeed.runtime.sequence_parallel.parallel_state_sp": "dstrain.runtime.sequence_parallel.parallel_state_sp",
}

# dstrain.<name> (and everything under it) -> its module in this package, or elsewhere in dstrain.
PUBLIC_PATHS: dict[str, str] = {
    "dstrain.zero": f"{_C}.zero",
    "dstrain.comm": f"{_C}.comm",
    "dstrain.pipe": f"{_C}.pipe",
    "dstrain.moe": f"{_C}.moe",
    "dstrain.checkpointing": f"{_C}.checkpointing",
    "dstrain.runtime": f"{_C}.runtime",
    "dstrain.utils": f"{_C}.utils",
    "dstrain.lr_schedules": "dstrain.engine.lr_schedules",
    "dstrain.dataloader": "dstrain.engine.dataloader",
    "dstrain.sequence": f"{_C}.sequence",
}

# Target modules that need a library the facade does not always have: the module's first name -> pip line.
_PROVIDERS = {"dstrain.pipe": "dspipe", "dstrain.moe": "dsmoe", f"{_C}.pipe": "dspipe", f"{_C}.moe": "dsmoe",
              "dstrain.sequence": "dsseq", f"{_C}.sequence": "dsseq", "dstrain.runtime.sequence_parallel": "dsseq",
              f"{_C}.runtime.sequence_parallel": "dsseq", "dstrain.runtime.tensor_parallel": "dstp",
              f"{_C}.runtime.tensor_parallel": "dstp", "dstrain.runtime.data_pipeline": "dsdata",
              f"{_C}.runtime.data_pipeline": "dsdata",
              "dspipe.schedules": "dspipe", f"{_C}.module_inject.auto_ep_layer": "dsmoe"}


def libraries_behind(target: str) -> list[str]:
    """The top-level packages serving `target`: its own, and the optional library it is built on."""
    found = [target.split(".")[0]]
    found += [lib for prefix, lib in _PROVIDERS.items() if target == prefix or target.startswith(prefix + ".")]
    return list(dict.fromkeys(found))


def script_folder() -> str:
    """The folder `python script.py` puts first on sys.path (the working directory for -c, -m and the REPL)."""
    first = sys.path[0] if sys.path else ""
    return os.path.abspath(first or os.getcwd())


def _inside(path: str, folder: str) -> bool:
    return os.path.dirname(os.path.abspath(path)) == folder or (
        os.path.basename(path) == "__init__.py" and os.path.dirname(os.path.dirname(os.path.abspath(path))) == folder)


def _found_elsewhere(name: str, folder: str) -> bool:
    """Whether `name` is also importable from somewhere other than `folder` (where it is installed)."""
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != folder]
    if importlib.machinery.PathFinder.find_spec(name, rest) is not None:
        return True
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder or getattr(finder, "root", None) is not None:
            continue  # the path was searched above; alias finders serve other names
        try:
            spec = finder.find_spec(name, None)
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
        if spec is not None and not (spec.origin and _inside(spec.origin, folder)):
            return True
    return False


def shadowing_file(library: str) -> str | None:
    """The file of a module named `library` beside the script that stands (or would stand) in for the installed
    library: already imported from the script's folder, or found there first. None when there is none, or when
    the script's folder is where the library lives (nothing else provides it)."""
    folder = script_folder()
    module = sys.modules.get(library)
    if module is not None:
        origin = getattr(module, "__file__", None)
    else:
        spec = importlib.machinery.PathFinder.find_spec(library, [folder])
        origin = spec.origin if spec is not None else None
    if not origin or origin == "namespace" or not _inside(origin, folder):
        return None
    return origin if _found_elsewhere(library, folder) else None


class ModuleAlias(importlib.abc.Loader):
    """Loads a name as the module `target` (imported, or taken from sys.modules): one object, two names."""

    def __init__(self, target: str):
        self.target = target
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        for library in libraries_behind(self.target):
            local = shadowing_file(library)
            if local is not None:
                raise ImportError(f"{spec.name} is served by dstrain's {library} library, but {local} has the same "
                                  f"name and would be imported in its place (the script's folder comes first on "
                                  f"sys.path, as `python script.py` puts it): rename that file", name=spec.name)
        try:
            module = importlib.import_module(self.target)
        except ModuleNotFoundError:
            library = next((lib for prefix, lib in _PROVIDERS.items() if self.target.startswith(prefix)), None)
            if library is not None:
                raise ModuleNotFoundError(f"{spec.name} (dstrain's {self.target}) needs the {library} library: "
                                          f"pip install {library}", name=spec.name) from None
            raise
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The target ran when it was imported. The import system has just stamped the alias's spec on it:
        # give it its own back, so its relative imports and reloads keep resolving where it lives.
        module.__spec__ = self._own_spec


class TableFinder(importlib.abc.MetaPathFinder):
    """Finds the names of `table` (exactly) as their target modules. With `prefixes`, a name under a key
    (`dstrain.moe.layer` under `dstrain.moe`) maps to the same place under its target. With `closed`,
    an unlisted name under `root` is an ImportError naming the table, instead of a search elsewhere."""

    def __init__(self, table: dict[str, str], root: str, *, prefixes: bool, closed: bool, table_name: str):
        self.table, self.root, self.prefixes, self.closed, self.table_name = table, root, prefixes, closed, table_name

    def target(self, fullname: str) -> str | None:
        if fullname in self.table:
            return self.table[fullname]
        if self.prefixes:
            for key, target in self.table.items():
                if fullname.startswith(key + "."):
                    return target + fullname[len(key):]
        return None

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        module = self.target(fullname)
        if module is None:
            if self.closed:
                from .callers import asked_by

                raise ModuleNotFoundError(f"{fullname}: dstrain maps only the DeepSpeed modules listed in "
                                          f"{self.table_name} (the facade README has the table); this one has no "
                                          f"dstrain counterpart{asked_by()}", name=fullname)
            return None
        # A target that is a package keeps its own __path__; a listed parent of listed children must be one.
        is_package = any(other.startswith(fullname + ".") for other in self.table)
        return importlib.machinery.ModuleSpec(fullname, ModuleAlias(module), is_package=is_package)


def deepspeed_finder() -> TableFinder:
    return TableFinder(MAPPED_PATHS, "deepspeed", prefixes=False, closed=True,
                       table_name="dstrain.compat.alias.MAPPED_PATHS")


def public_paths_finder() -> TableFinder:
    return TableFinder(PUBLIC_PATHS, "dstrain", prefixes=True, closed=False,
                       table_name="dstrain.compat.alias.PUBLIC_PATHS")
