"""`DeepSpeedEngine`: the module, its ZeRO optimizer, scheduler, loader and reporting behind one
forward / backward / step loop, as DeepSpeed's engine presents them."""

from __future__ import annotations

import gc
from typing import Any

import torch

import dscomm
import dszero
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from . import checkpointing
from .dataloader import DeepSpeedDataLoader
from .errors import DstrainError
from .logs import log_on_rank0
from .precision_setup import PrecisionSetup
from .step_reporting import StepReporter
from .tensorwise import TensorwiseOnFlat, needs_whole_tensors


class DeepSpeedEngine(torch.nn.Module):
    """Built by `dstrain.initialize()`; `engine(*inputs)`, `engine.backward(loss)`, `engine.step()`."""

    def __init__(self, *, model: torch.nn.Module, config: DeepSpeedConfig, optimizer: Any = None,
                 model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
                 collate_fn: Any = None, data_parallel_group: Any = None):
        super().__init__()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"initialize(model=...) must be a torch.nn.Module, got {type(model).__name__}")
        self._config = config
        self.config = config.to_dict()  # the resolved config as JSON data, as DeepSpeed's engine.config
        self.module = model
        self.data_parallel_group = data_parallel_group
        self.global_rank = dscomm.get_rank()
        self.world_size = dscomm.get_world_size()
        self.local_rank = dscomm.get_local_rank()
        self.dp_world_size = torch.distributed.get_world_size(data_parallel_group)
        self.device = _training_device(self.local_rank)
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self._backwards_since_step = 0
        self._boundary_override: bool | None = None
        self._step_applied = False
        self._engine_backward_active = False
        self._gc_disabled = False
        self._compiled = False

        self.precision = PrecisionSetup(config, self.device)
        model.to(self.device)
        self.precision.prepare_module(model)
        if config.comms_logger.enabled:
            dscomm.configure(config.comms_logger)
        if not checkpointing.is_configured():  # the config's activation_checkpointing section, until the script's own
            checkpointing.configure(None, deepspeed_config=config)
        self._broadcast_module_state()
        self.basic_optimizer = self._build_basic_optimizer(optimizer, model_parameters)
        self.optimizer = self._wrap_optimizer(self.basic_optimizer) if self.basic_optimizer is not None else None
        self.lr_scheduler = self._build_scheduler(lr_scheduler)
        self.training_dataloader = self._build_loader(training_data, collate_fn) if training_data is not None else None
        self.reporter = StepReporter(self)
        if config.disable_python_gc:  # last, so a failed initialize() leaves the collector on
            gc.disable()
            self._gc_disabled = True
        if config.dump_state:
            log_on_rank0(self.global_rank, self._state_text())
        features = ", ".join(config.enabled_features()) or "plain data parallelism"
        log_on_rank0(self.global_rank, f"engine ready: {self.dp_world_size} data-parallel rank(s), {features}; "
                                       f"batch {self.train_batch_size()} = micro {self.train_micro_batch_size_per_gpu()}"
                                       f" x accumulation {self.gradient_accumulation_steps()} x ranks "
                                       f"{self.dp_world_size}")

    # ------------------------------------------------------------------ construction
    def _broadcast_module_state(self) -> None:
        # Every rank starts from rank 0's weights and buffers (ZeRO re-broadcasts the flat groups it builds).
        if self.dp_world_size == 1:
            return
        src = torch.distributed.get_global_rank(self.data_parallel_group, 0)
        with torch.no_grad():
            for tensor in [*self.module.parameters(), *self.module.buffers()]:
                if tensor.numel():
                    dscomm.broadcast(tensor.data, src, group=self.data_parallel_group, log_name="engine_broadcast")

    def _build_basic_optimizer(self, client: Any, model_parameters: Any) -> torch.optim.Optimizer | None:
        config = self._config.optimizer
        if client is not None and config is not None:
            raise ConfigError(Problem("optimizer", f"initialize() was given an optimizer ({type(client).__name__}) "
                                                   f"and the config names one ({config.type}); keep one of them"))
        params = model_parameters if model_parameters is not None else self.module.parameters()
        if client is None:
            if config is None:
                return None
            from .optim_factory import build_optimizer

            return build_optimizer(config, params)
        if isinstance(client, torch.optim.Optimizer):
            return client
        if callable(client):
            built = client(params)
            if not isinstance(built, torch.optim.Optimizer):
                raise TypeError(f"the optimizer callable returned {type(built).__name__}, not a torch.optim.Optimizer")
            return built
        raise TypeError(f"initialize(optimizer=...) must be a torch.optim.Optimizer or a callable that builds one "
                        f"from the parameters, got {type(client).__name__}")

    def _wrap_optimizer(self, basic: torch.optim.Optimizer) -> dszero.ZeroOptimizer:
        cfg = self._config
        clipping = cfg.gradient_clipping if isinstance(cfg.gradient_clipping, (int, float)) else 0.0
        tensorwise = TensorwiseOnFlat(basic) if needs_whole_tensors(basic) else None
        if tensorwise is not None:
            tensorwise.check_stage(cfg.zero_optimization.stage, type(basic).__name__)
            self.basic_optimizer = tensorwise  # what schedulers and get_lr() see
        zero = dszero.ZeroOptimizer(
            self.module, tensorwise or basic, cfg.zero_optimization, precision=self.precision.precision,
            gradient_clipping=float(clipping), group=self.data_parallel_group,
            aio=cfg.aio.handle_kwargs(), gradient_average=cfg.gradient_allreduce_op == "mean",
            grad_accum_dtype=self.precision.grad_accum_dtype,
            gradient_predivide_factor=cfg.gradient_predivide_factor, prescale_gradients=cfg.prescale_gradients,
            communication_dtype=self.precision.communication_dtype)
        if tensorwise is not None:
            tensorwise.bind(zero.groups)
        return zero

    def _build_scheduler(self, client: Any) -> Any:
        config = self._config.scheduler
        if client is not None and config is not None:
            raise ConfigError(Problem("scheduler", f"initialize() was given an lr_scheduler "
                                                   f"({type(client).__name__}) and the config names one "
                                                   f"({config.type}); keep one of them"))
        if client is None:
            if config is None:
                return None
            if self.basic_optimizer is None:
                raise ConfigError(Problem("scheduler", "a scheduler needs an optimizer: add an optimizer section "
                                                       "or pass optimizer= to initialize()"))
            from .optim_factory import build_scheduler

            return build_scheduler(config, self.basic_optimizer)
        if hasattr(client, "step") and hasattr(client, "state_dict"):
            return client
        if callable(client):
            return client(self.basic_optimizer)
        raise TypeError(f"initialize(lr_scheduler=...) must be a scheduler or a callable that builds one from the "
                        f"optimizer, got {type(client).__name__}")

    def _build_loader(self, dataset: Any, collate_fn: Any) -> DeepSpeedDataLoader:
        rank = torch.distributed.get_rank(self.data_parallel_group)
        return DeepSpeedDataLoader(dataset, self.train_micro_batch_size_per_gpu(), rank=rank,
                                   world_size=self.dp_world_size, collate_fn=collate_fn,
                                   drop_last=self._config.dataloader_drop_last)

    def deepspeed_io(self, dataset: Any, batch_size: int | None = None, route: str = "train", collate_fn: Any = None,
                     num_workers: int = 0, data_sampler: Any = None) -> DeepSpeedDataLoader:
        """A distributed loader over `dataset` (DeepSpeed's name), e.g. for evaluation data."""
        rank = torch.distributed.get_rank(self.data_parallel_group)
        return DeepSpeedDataLoader(dataset, batch_size or self.train_micro_batch_size_per_gpu(), rank=rank,
                                   world_size=self.dp_world_size, collate_fn=collate_fn, num_workers=num_workers,
                                   data_sampler=data_sampler, shuffle=route == "train",
                                   drop_last=self._config.dataloader_drop_last)

    # ------------------------------------------------------------------ the loop
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self.reporter.before_forward()
        timer = self.reporter.timer("fwd")
        timer.start()
        inputs = self.precision.cast_inputs(inputs)
        kwargs = self.precision.cast_inputs(kwargs)
        with self.precision.forward_context():
            output = self.module(*inputs, **kwargs)
        timer.stop()
        if self.module.training and torch.is_grad_enabled() and self.optimizer is not None:
            _hook_outputs(output, self._scale_plain_backward)
        return output

    def _loss_factor(self) -> float:
        """What a loss is multiplied by before backward: 1 / accumulation steps (managed) times the fp16 scale."""
        factor = self.optimizer.backward_scale if self.optimizer is not None else 1.0
        if self._config.managed_gradient_accumulation:
            factor /= self.gradient_accumulation_steps()
        return factor

    def _scale_plain_backward(self, grad: torch.Tensor) -> torch.Tensor | None:
        # A plain loss.backward() skips engine.backward's scaling: apply it to what flows into the outputs.
        if self._engine_backward_active:
            return None
        factor = self._loss_factor()
        return grad * factor if factor != 1.0 else None

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """loss.backward() with gradient-accumulation averaging and the fp16 loss scale; returns the loss."""
        self._require_optimizer("backward")
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise DstrainError(f"engine.backward(loss) needs a one-element loss tensor, got "
                               f"{tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__}")
        self.reporter.record_loss(loss)
        timer = self.reporter.timer("bwd")
        timer.start()
        factor = self._loss_factor() if scale_wrt_gas else self.optimizer.backward_scale
        self._engine_backward_active = True
        try:
            (loss * factor if factor != 1.0 else loss).backward(retain_graph=retain_graph)
        finally:
            self._engine_backward_active = False
        self._backwards_since_step += 1
        timer.stop()
        return loss

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next step() updates the weights."""
        if self._boundary_override is not None:
            return self._boundary_override
        if not self._config.managed_gradient_accumulation:
            return True
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Override the boundary (e.g. at the end of an epoch); None returns to counting micro-steps."""
        self._boundary_override = is_boundary

    def step(self, lr_kwargs: dict | None = None) -> None:
        """Count the micro-batch; at the accumulation boundary, update the weights and the scheduler."""
        self._require_optimizer("step")
        boundary = self.is_gradient_accumulation_boundary()
        timer = self.reporter.timer("step")
        timer.start()
        self._step_applied = False
        if boundary:
            self._step_applied = self.optimizer.step()
            if self._step_applied and self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
        timer.stop()
        micro_batches = max(self._backwards_since_step, 1)
        self.micro_steps += 1
        if boundary:
            self.global_steps += 1
            if self._config.managed_gradient_accumulation:
                self.global_samples += self.train_batch_size()
            else:
                self.global_samples += micro_batches * self.train_micro_batch_size_per_gpu() * self.dp_world_size
            self._backwards_since_step = 0
            self.reporter.after_step()

    def zero_grad(self) -> None:
        """Drop the accumulated gradients (step() already does this at each boundary)."""
        if self.optimizer is not None:
            self.optimizer.zero_grad()

    def was_step_applied(self) -> bool:
        """False when the last boundary step was skipped for an fp16 overflow (or no boundary was reached)."""
        return self._step_applied

    def _require_optimizer(self, what: str) -> None:
        if self.optimizer is None:
            raise DstrainError(f"engine.{what}() needs an optimizer: add an \"optimizer\" section to the config or "
                               f"pass optimizer= to initialize()")

    # ------------------------------------------------------------------ accessors
    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self._config.zero_optimization.stage

    def zero_optimization(self) -> bool:
        return self._config.zero_optimization.stage > 0

    def fp16_enabled(self) -> bool:
        return self.precision.fp16

    def bfloat16_enabled(self) -> bool:
        return self.precision.bf16

    def gradient_clipping(self) -> float:
        return self.optimizer.gradient_clipping if self.optimizer is not None else 0.0

    def steps_per_print(self) -> int:
        return self._config.steps_per_print

    @property
    def loss_scale(self) -> float:
        return self.optimizer.loss_scale if self.optimizer is not None else 1.0

    @property
    def skipped_steps(self) -> int:
        return self.optimizer.skipped_steps if self.optimizer is not None else 0

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.basic_optimizer.param_groups] if self.basic_optimizer else []

    def get_mom(self) -> list[Any]:
        if self.basic_optimizer is None:
            return []
        return [group.get("betas", group.get("momentum")) for group in self.basic_optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        return self.optimizer.get_global_grad_norm() if self.optimizer is not None else None

    def get_type(self) -> type:
        return type(self.module)

    def compile(self, backend: str = "inductor", compile_kwargs: dict | None = None) -> None:
        """torch.compile the wrapped module in place (DeepSpeed's engine.compile); hooks stay attached."""
        self.module.compile(backend=backend, **(compile_kwargs or {}))
        self._compiled = True

    @property
    def is_compiled(self) -> bool:
        return self._compiled

    def collect_python_gc(self) -> int:
        """Run the cyclic garbage collector by hand (with disable_python_gc it never runs on its own)."""
        return gc.collect()

    def __getattr__(self, name: str) -> Any:
        # As DeepSpeed's engine: attributes it lacks are looked up on the wrapped module.
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self._modules.get("module")
            if module is not None and hasattr(module, name):
                return getattr(module, name)
            raise

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False):
        from .engine_checkpoint import save_checkpoint

        return save_checkpoint(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False,
                        custom_load_fn=None):
        from .engine_checkpoint import load_checkpoint

        return load_checkpoint(self, load_dir, tag, load_module_strict=load_module_strict,
                               load_optimizer_states=load_optimizer_states,
                               load_lr_scheduler_states=load_lr_scheduler_states, load_module_only=load_module_only)

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters=False):
        from .engine_checkpoint import save_16bit_model

        return save_16bit_model(self, save_dir, save_filename)

    # ------------------------------------------------------------------ the rest
    def _state_text(self) -> str:
        import json

        return "engine config:\n" + json.dumps(self.config, indent=2, sort_keys=True, default=str)

    def destroy(self) -> None:
        """Close the monitors and give the garbage collector back."""
        self.reporter.close()
        if self._gc_disabled:
            gc.enable()
            self._gc_disabled = False


def _training_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _hook_outputs(output: Any, hook) -> None:
    if torch.is_tensor(output):
        if output.requires_grad:
            output.register_hook(hook)
    elif isinstance(output, (list, tuple)):
        for item in output:
            _hook_outputs(item, hook)
    elif isinstance(output, dict):
        for item in output.values():
            _hook_outputs(item, hook)
