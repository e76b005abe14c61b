"""The parts an engine trains with, built from the config in one place and one order: device and
precision, the module's starting weights, the optimizer wrapped by ZeRO over the data-parallel group,
the scheduler, the data loader, the progress counters and the reporter. Every engine (the plain one,
a pipeline one beside it) is built from these parts; checkpoints and reporting take the parts, not
an engine."""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

import dscomm
import dszero
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ..compat import checkpointing
from ..wiring import dsdata as wiring_dsdata
from ..wiring.dsmoe import broadcast_expert_parameters, expert_param_group_keys, is_expert_tensor
from . import python_gc
from .dataloader import DeepSpeedDataLoader
from .precision_setup import PrecisionSetup
from .progress import TrainingProgress
from .step_reporting import StepReporter
from .tensorwise import TensorwiseOnFlat, needs_whole_tensors


@dataclass(eq=False)
class TrainingParts:
    """What one engine trains with. `optimizer`, `lr_scheduler` and `training_dataloader` may be None
    (no optimizer given, no scheduler, no training data); an engine may replace them as DeepSpeed allows."""

    config: DeepSpeedConfig
    module: torch.nn.Module
    device: torch.device
    precision: PrecisionSetup
    basic_optimizer: Any  # what schedulers and get_lr() see: the torch optimizer (or its whole-tensor adapter)
    optimizer: dszero.ZeroOptimizer | None
    lr_scheduler: Any
    training_dataloader: DeepSpeedDataLoader | None
    progress: TrainingProgress
    reporter: StepReporter
    data_parallel_group: Any
    global_rank: int
    dp_rank: int
    dp_world_size: int
    groups: Any = None  # dscomm.ParallelGroups, where initialize() built the layout
    sequence_parallel_size: int = 1  # ranks splitting each sample (ZeRO's group spans them and the data ranks)
    release_gc: Any = None  # disable_python_gc: gives this engine's hold on the collector back (python_gc.py)
    step_hooks: list = field(default_factory=list)  # the composition's: called with the global step after each step

    @property
    def data_rank(self) -> int:
        """This rank's data-parallel replica: the batch it reads (sequence ranks of a replica read the same)."""
        return self.dp_rank // self.sequence_parallel_size

    @property
    def data_world_size(self) -> int:
        """Data-parallel replicas: what the batch size counts (the ZeRO group over the sequence ranks)."""
        return self.dp_world_size // self.sequence_parallel_size

    def close(self) -> None:
        """Close the monitors and give the garbage collector back (on only when no other engine holds it)."""
        self.reporter.close()
        if self.release_gc is not None:
            self.release_gc()
            self.release_gc = None


def build_training_parts(model: torch.nn.Module, config: DeepSpeedConfig, *, optimizer: Any = None,
                         model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
                         collate_fn: Any = None, data_parallel_group: Any = None, groups: Any = None,
                         step_hooks: list | None = None) -> TrainingParts:
    """The parts for `model`, trained data-parallel over `data_parallel_group` (None: the whole world);
    `groups`: the run's dscomm.ParallelGroups, whose norm group decides gradient norms and overflow;
    `step_hooks`: the composition's (compose.Composed.step_hooks), run by the reporter after each step.

    `optimizer` and `lr_scheduler` are the client's (an object or a callable that builds one), or
    None to build them from the config; giving both a client's and a config's is an error.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"initialize(model=...) must be a torch.nn.Module, got {type(model).__name__}")
    dp_rank = torch.distributed.get_rank(data_parallel_group)
    dp_world_size = torch.distributed.get_world_size(data_parallel_group)
    # With sequence parallelism the group is sequence x data (sequence fastest): replicas are every sp-th rank.
    sequence = groups.size("sequence") if groups is not None and data_parallel_group is groups.sequence_data else 1
    device = training_device(dscomm.get_local_rank())
    precision = PrecisionSetup(config, device)
    # The order matters: the module reaches its device and dtype before ZeRO flattens its parameters,
    # and every rank holds rank 0's weights before ZeRO copies them into its masters.
    model.to(device)
    precision.prepare_module(model)
    if config.comms_logger.enabled:
        dscomm.configure(config.comms_logger)
    # This config's activation_checkpointing section (the layout as its mpu), unless the script configured its own.
    checkpointing.configure_from_engine(config, groups)
    broadcast_module_state(model, data_parallel_group)
    basic = _basic_optimizer(config, optimizer, model_parameters if model_parameters is not None else model.parameters(),
                             model)
    zero = None
    if basic is not None:
        expert_param_group_keys(basic, model, groups)  # MoE groups: reduced over their expert-data group
        # Gradient norms and the fp16 overflow are decided over the layout's norm group (every stage and shard).
        norm_group = groups.norm if groups is not None else None
        basic, zero = _zero_optimizer(config, model, basic, precision, data_parallel_group, norm_group)
    elif config.zero_optimization.stage == 3:
        # No optimizer at stage 3 (an evaluation or reference model): the parameters stay partitioned and each
        # module gathers its own around its forward, as DeepSpeed's engine does.
        dszero.ZeroInference(model, config.zero_optimization, group=data_parallel_group)
    scheduler = _scheduler(config, lr_scheduler, basic)
    loader = None
    wiring_dsdata.warn_curriculum_without_data(config, training_data)
    if training_data is not None:
        # With curriculum learning on, dsdata's sampler draws the batches (and its state is checkpointed).
        loader = wiring_dsdata.curriculum_loader(config, training_data, collate_fn=collate_fn, dp_rank=dp_rank,
                                                 dp_world_size=dp_world_size, data_parallel_group=data_parallel_group,
                                                 global_rank=dscomm.get_rank())
        if loader is None:
            loader = DeepSpeedDataLoader(training_data, config.train_micro_batch_size_per_gpu,
                                         rank=dp_rank // sequence, world_size=dp_world_size // sequence,
                                         collate_fn=collate_fn, drop_last=config.dataloader_drop_last)
    progress = TrainingProgress()
    step_hooks = list(step_hooks or [])
    reporter = StepReporter.from_config(config, rank=dscomm.get_rank(), module=model, progress=progress,
                                        fp16=precision.fp16, step_hooks=step_hooks)
    parts = TrainingParts(config=config, module=model, device=device, precision=precision, basic_optimizer=basic,
                          optimizer=zero, lr_scheduler=scheduler, training_dataloader=loader, progress=progress,
                          reporter=reporter, data_parallel_group=data_parallel_group, global_rank=dscomm.get_rank(),
                          dp_rank=dp_rank, dp_world_size=dp_world_size, groups=groups, step_hooks=step_hooks,
                          sequence_parallel_size=sequence)
    if config.disable_python_gc:  # last, so a failed build leaves the collector on
        parts.release_gc = python_gc.hold()
        weakref.finalize(parts, parts.release_gc)  # an engine dropped without destroy() lets go too
    return parts


def training_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def broadcast_module_state(module: torch.nn.Module, group: Any) -> None:
    """Every rank of `group` starts from its first rank's weights and buffers (ZeRO re-broadcasts the
    flat groups it builds)."""
    if torch.distributed.get_world_size(group) == 1:
        return
    src = torch.distributed.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.numel() and not is_expert_tensor(tensor):  # experts differ across expert-parallel ranks
                dscomm.broadcast(tensor.data, src, group=group, log_name="engine_broadcast")
    broadcast_expert_parameters(module)


def _basic_optimizer(config: DeepSpeedConfig, client: Any, params: Any,
                     model: torch.nn.Module) -> torch.optim.Optimizer | None:
    section = config.optimizer
    if client is not None and section is not None:
        # DeepSpeed's documented rule: the client's object wins over the config's section.
        warnings.warn(f"initialize() was given an optimizer ({type(client).__name__}) and the config's optimizer "
                      f"section names {section.type}: training with the one passed to initialize(), as DeepSpeed "
                      f"does; remove the config's section to silence this", stacklevel=4)
    if client is None:
        if section is None:
            return None
        from .optim_factory import build_optimizer

        # The model: Muon tags its parameters by name. Offloaded, Adam's step is dszero's CPU Adam.
        return build_optimizer(section, params, model=model,
                               offloaded=config.zero_optimization.optimizer_offload_device != "none",
                               fp32_optimizer_states=not config.bf16.bf16_optimizer_states)
    if isinstance(client, torch.optim.Optimizer):
        return client
    if callable(client):
        built = client(params)
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError(f"the optimizer callable returned {type(built).__name__}, not a torch.optim.Optimizer")
        return built
    raise TypeError(f"initialize(optimizer=...) must be a torch.optim.Optimizer or a callable that builds one "
                    f"from the parameters, got {type(client).__name__}")


def gradient_clipping_of(config: DeepSpeedConfig) -> float:
    """The clipping norm a run applies: the config's gradient_clipping (an unresolved "auto" clips nothing)."""
    value = config.gradient_clipping
    return float(value) if isinstance(value, (int, float)) else 0.0


def _zero_optimizer(config: DeepSpeedConfig, module: torch.nn.Module, basic: torch.optim.Optimizer,
                    precision: PrecisionSetup, group: Any, norm_group: Any) -> tuple[Any, dszero.ZeroOptimizer]:
    """(what schedulers see, the ZeRO optimizer): per-tensor optimizers without a sharded step of their
    own run through an adapter over ZeRO's flat groups (stage 0), and the scheduler drives the adapter;
    Lamb and Muon step on the shards themselves (dszero's whole-tensor step)."""
    tensorwise = TensorwiseOnFlat(basic) if needs_whole_tensors(basic) else None
    if tensorwise is not None:
        tensorwise.check_stage(config.zero_optimization.stage, type(basic).__name__)
    zero = dszero.ZeroOptimizer(
        module, tensorwise or basic, config.zero_optimization, precision=precision.precision,
        gradient_clipping=gradient_clipping_of(config), group=group, aio=config.aio.handle_kwargs(),
        gradient_average=config.gradient_allreduce_op == "mean", grad_accum_dtype=precision.grad_accum_dtype,
        gradient_predivide_factor=config.gradient_predivide_factor, prescale_gradients=config.prescale_gradients,
        communication_dtype=precision.communication_dtype, norm_group=norm_group)
    if tensorwise is not None:
        tensorwise.bind(zero)
        return tensorwise, zero
    return basic, zero


def _scheduler(config: DeepSpeedConfig, client: Any, optimizer: Any) -> Any:
    section = config.scheduler
    if client is not None and section is not None:
        warnings.warn(f"initialize() was given an lr_scheduler ({type(client).__name__}) and the config's scheduler "
                      f"section names {section.type}: stepping the one passed to initialize(), as DeepSpeed does; "
                      f"remove the config's section to silence this", stacklevel=4)
    if client is None:
        if section is None:
            return None
        if optimizer is None:
            raise ConfigError(Problem("scheduler", "a scheduler needs an optimizer: add an optimizer section "
                                                   "or pass optimizer= to initialize()"))
        from .optim_factory import build_scheduler

        return build_scheduler(section, optimizer)
    if hasattr(client, "step") and hasattr(client, "state_dict"):
        return client
    if callable(client):
        return client(optimizer)
    raise TypeError(f"initialize(lr_scheduler=...) must be a scheduler or a callable that builds one from the "
                    f"optimizer, got {type(client).__name__}")
