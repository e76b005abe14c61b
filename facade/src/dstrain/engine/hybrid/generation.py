"""The Hybrid Engine's generation: `engine.module.generate(...)` (and `engine.generate(...)`) between
training steps, as DeepSpeed-Chat calls it, on the model's own `generate` and KV cache.

- ZeRO 0-2: the weights are whole already; generation runs as is.
- ZeRO-3 with `pin_parameters` (the default): every weight is gathered once per generate call and held
  (dszero.HeldParameters) while the tokens are produced, so no token waits on a collective and ranks may
  generate different prompts and lengths; released after. Without it, layers are gathered at each
  forward as in training (memory-light, and every rank runs the same forwards: `synced_gpus` is turned on).
- `inference_tp_size` > 1: generation runs on a tensor-parallel replica (tensor_parallel.py).
- LoRA modules (`fuse_lora_weight` / `unfuse_lora_weight`) are fused for generation, exactly unfused after.
- Generation draws from its own random stream (the same on every rank of an inference group), so training
  after it sees the random numbers, weights, optimizer state and counters it would have seen without it.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

import dscomm
import dszero
from dscomm.checkpointing import CudaRNGStatesTracker
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ...errors import DstrainError
from . import lora
from .latency import LatencySplit, monitor_events
from .tensor_parallel import InferenceReplica, inference_groups

STREAM = "hybrid-engine-generation"
_SEED_SALT = 0x5DEECE66D


class HybridGeneration:
    """Built by the engine when hybrid_engine.enabled; replaces `module.generate` with `generate`."""

    def __init__(self, module: torch.nn.Module, cfg: DeepSpeedConfig, *, device: torch.device, data_group: Any,
                 rank: int, zero: Any = None):
        section = cfg.hybrid_engine
        original = getattr(module, "generate", None)
        if not callable(original):
            raise ConfigError(Problem("hybrid_engine.enabled", f"the Hybrid Engine generates with the model's own "
                                      f"generate(); {type(module).__name__} has none (a Hugging Face causal LM has)",
                                      True))
        if section.inference_tp_size > 1 and cfg.tensor_parallel.autotp_size > 1:
            raise ConfigError(Problem("hybrid_engine.inference_tp_size", "cannot be combined with "
                                      "tensor_parallel.autotp_size > 1: the trained model is tensor-parallel already "
                                      "and generates on its own layout; set inference_tp_size to 1",
                                      section.inference_tp_size))
        self.module = module
        self.section = section
        self.zero3 = cfg.zero_optimization.stage == 3
        # Held weights need no gathering hooks; with them off every token's forward takes torch's fast module
        # call (a small model spends a visible share of a token in ~2 hook calls per module otherwise).
        self.controls = dszero.CompilerControls(zero) if self.zero3 and zero is not None else None
        self.device = device
        self._generate = original
        fusable = {id(m) for m in lora.lora_modules(module)}
        self.lora = {name: m for name, m in module.named_modules() if id(m) in fusable}
        self.dp_world = dist.get_world_size(data_group) if dist.is_initialized() else 1
        self.latency = LatencySplit(rank)
        self.replica: InferenceReplica | None = None
        dp_rank = dist.get_rank(data_group) if dist.is_initialized() else 0
        if section.inference_tp_size > 1:
            group = inference_groups(data_group, section.inference_tp_size)
            self.replica = InferenceReplica(module, cfg, group, device)
        self.rng = CudaRNGStatesTracker()
        self.rng.add(STREAM, self._stream_seed(data_group, dp_rank // section.inference_tp_size))
        self.cuda_graph = section.enable_cuda_graph and torch.cuda.is_available() and not (
            self.zero3 or section.release_inference_cache or section.inference_tp_size > 1)
        if section.enable_cuda_graph and not torch.cuda.is_available():
            warnings.warn("hybrid_engine.enable_cuda_graph has no effect without CUDA; it is ignored", stacklevel=4)
        module.generate = self.generate  # DeepSpeed-Chat calls engine.module.generate(...)

    @staticmethod
    def _stream_seed(data_group: Any, inference_group: int) -> int:
        # One seed for the run (data-parallel rank 0's), one stream per inference group: TP ranks sample alike.
        seed = torch.tensor([torch.initial_seed() % (2 ** 31)], dtype=torch.long)
        if dist.is_initialized() and dist.get_world_size(data_group) > 1:
            dscomm.broadcast(seed, dist.get_global_rank(data_group, 0) if data_group is not None else 0,
                             group=data_group, log_name="hybrid_generation_seed")
        return (int(seed) ^ _SEED_SALT) + 7919 * inference_group

    # ------------------------------------------------------------------ generate
    def generate(self, *inputs: Any, **kwargs: Any) -> Any:
        prompts = inputs[0] if inputs else kwargs.get("input_ids")
        if not torch.is_tensor(prompts) or prompts.dim() != 2:
            raise DstrainError("generate(): pass the prompts as a [batch, length] tensor of token ids (input_ids)")
        new_tokens = self._new_tokens(prompts.shape[1], kwargs)
        started = time.perf_counter()
        with torch.no_grad(), self.rng.fork(STREAM):
            if self.replica is not None:
                gather_s = self.replica.refresh(self.lora, lora.fused)
                rest = {k: v for k, v in kwargs.items() if k != "input_ids"}
                output = self.replica.generate(self.replica.replica.generate, prompts, rest, new_tokens,
                                               self._pad_id(kwargs))
                if self.section.release_inference_cache:
                    self.replica.release()
            else:
                with contextlib.ExitStack() as stack:
                    stack.enter_context(self._gathered(kwargs))
                    if self.section.pin_parameters:
                        stack.enter_context(self._hooks_off())
                    stack.enter_context(lora.fused(list(self.lora.values())))
                    gather_s = time.perf_counter() - started
                    output = self._generate(*inputs, **self._graph_kwargs(kwargs, new_tokens))
            if self.section.release_inference_cache:
                _free_caches()
        self.latency.generated(gather_s, time.perf_counter() - started - gather_s, prompts.shape[0] * self.dp_world)
        return output

    def _gathered(self, kwargs: dict[str, Any]) -> contextlib.AbstractContextManager:
        if not self.zero3:
            return contextlib.nullcontext()
        if self.section.pin_parameters:
            return dszero.HeldParameters(self.module.parameters())
        # Layers gathered at each forward, as in training: every rank must run every forward (HF's synced_gpus).
        if dist.is_initialized() and dist.get_world_size() > 1:
            kwargs.setdefault("synced_gpus", True)
        return dszero.HeldParameters([p for m in self.lora.values() for p in m.parameters(recurse=False)])

    @contextlib.contextmanager
    def _hooks_off(self) -> Iterator[None]:
        """Stage 3's gathering hooks off while every weight is held (no_grad: nothing to refuse), back after."""
        if self.controls is None or not self.controls.module_hooks_on:
            yield
            return
        self.controls.remove_module_hooks()
        try:
            yield
        finally:
            self.controls.restore_module_hooks()

    def _new_tokens(self, prompt_length: int, kwargs: dict[str, Any]) -> int:
        """How many tokens this call may add; refused when prompt + new exceeds max_out_tokens."""
        config = kwargs.get("generation_config") or getattr(self.module, "generation_config", None)
        if kwargs.get("max_new_tokens") is not None:
            new = int(kwargs["max_new_tokens"])
        elif kwargs.get("max_length") is not None:
            new = int(kwargs["max_length"]) - prompt_length
        elif getattr(config, "max_new_tokens", None) is not None:
            new = int(config.max_new_tokens)
        else:
            new = int(getattr(config, "max_length", None) or 20) - prompt_length
        limit = self.section.max_out_tokens
        if prompt_length + new > limit:
            raise ConfigError(Problem("hybrid_engine.max_out_tokens", f"is {limit}, but this generate() asks for "
                                      f"{prompt_length + new} tokens (prompt {prompt_length} + {new} new): raise "
                                      f"max_out_tokens or ask for fewer", limit))
        return max(new, 0)

    def _pad_id(self, kwargs: dict[str, Any]) -> int:
        config = kwargs.get("generation_config") or getattr(self.module, "generation_config", None)
        for candidate in (kwargs.get("pad_token_id"), getattr(config, "pad_token_id", None),
                          getattr(config, "eos_token_id", None)):
            if isinstance(candidate, (list, tuple)):
                candidate = candidate[0] if candidate else None
            if candidate is not None:
                return int(candidate)
        return 0

    def _graph_kwargs(self, kwargs: dict[str, Any], new_tokens: int) -> dict[str, Any]:
        """enable_cuda_graph on CUDA: transformers' static KV cache, whose decode step transformers compiles
        into CUDA graphs; it needs a pinned generation length, as the reference says."""
        if not self.cuda_graph:
            return kwargs
        if kwargs.get("min_new_tokens") != new_tokens:
            raise ConfigError(Problem("hybrid_engine.enable_cuda_graph", f"needs a pinned generation length: pass "
                                      f"min_new_tokens equal to max_new_tokens ({new_tokens})", True))
        return {**kwargs, "cache_implementation": "static"}

    # ------------------------------------------------------------------ the training loop around it
    def mode_changed(self, training: bool, monitor: Any, step: int) -> None:
        if training:
            self.latency.training()
            return
        figures = self.latency.evaluating()
        if figures is not None and monitor is not None and monitor.enabled:
            monitor.write_events(monitor_events(figures, step))

    def stepped(self) -> None:
        self.latency.stepped()


def _free_caches() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
