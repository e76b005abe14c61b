"""Turning random-LTD on in a model: wrap its layers, give the chosen ones the schedule, and strip the
wrappers from state dicts again."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import nn

from ..curriculum_scheduler import config_as_dict
from ..errors import DataEfficiencyError
from .layer import WRAPPED, RandomLayerTokenDrop
from .scheduler import BASE, RandomLTDScheduler


def _target(model: Any) -> nn.Module:
    return model.module if isinstance(getattr(model, "module", None), nn.Module) else model


def convert_to_random_ltd(model: Any, convert_type: type) -> Any:
    """Wrap every `convert_type` layer of `model` (an engine: its module) in a RandomLayerTokenDrop, in
    place, then call `model.random_ltd_initialize()` when the model has it (an engine does: it gives the
    layers the run's schedule). Returns `model`."""
    if not isinstance(convert_type, type) or not issubclass(convert_type, nn.Module):
        raise DataEfficiencyError(f"convert_to_random_ltd(model, convert_type): convert_type must be the layer's "
                                  f"nn.Module class, got {convert_type!r}")
    target = _target(model)
    found = _outermost(target, convert_type)
    already = [m for m in target.modules() if isinstance(m, RandomLayerTokenDrop)
               and isinstance(m.random_ltd_layer, convert_type)]
    if not found and not already:
        raise DataEfficiencyError(f"convert_to_random_ltd: {type(target).__name__} has no {convert_type.__name__} "
                                  f"layer to wrap")
    for name in found:
        parent_name, _, child = name.rpartition(".")
        parent = target.get_submodule(parent_name)
        setattr(parent, child, RandomLayerTokenDrop(getattr(parent, child)))
    initialize = getattr(model, "random_ltd_initialize", None)
    if callable(initialize):
        initialize()
    return model


def _outermost(module: nn.Module, convert_type: type) -> list[str]:
    """Names of the `convert_type` layers not inside another one or inside a wrapper already."""
    taken: list[str] = []
    names: list[str] = []
    for name, child in module.named_modules():
        if not name or any(name.startswith(f"{n}.") for n in taken):
            continue
        if isinstance(child, RandomLayerTokenDrop):
            taken.append(name)
        elif isinstance(child, convert_type):
            taken.append(name)
            names.append(name)
    return names


def random_ltd_layers(model: Any) -> list[RandomLayerTokenDrop]:
    """The model's RandomLayerTokenDrop wrappers, in module order: the layer index random_ltd_layer_id counts."""
    return [m for m in _target(model).modules() if isinstance(m, RandomLayerTokenDrop)]


def configure_random_ltd(model: Any, config: Any, scheduler: RandomLTDScheduler) -> list[int]:
    """Give the wrapped layers whose index (their position among the wrappers, in module order) is in
    random_ltd_layer_id the schedule; the others keep every token. Returns the configured indices.

    Layers are matched by index, not by a substring of their module name: DeepSpeed's name test gives
    layer 1's setting to layer 10 too."""
    section = config_as_dict(config)
    layers = random_ltd_layers(model)
    ids = sorted(section.get("random_ltd_layer_id") or [])
    total = section.get("total_layer_num")
    if len(layers) != total:
        raise DataEfficiencyError(f"{BASE}.total_layer_num is {total} but the model has {len(layers)} random-LTD "
                                  f"wrapped layers; convert_to_random_ltd wraps every layer of the class given, and "
                                  f"total_layer_num must count them")
    if len(set(ids)) != len(ids) or any(not 0 <= i < len(layers) for i in ids):
        raise DataEfficiencyError(f"{BASE}.random_ltd_layer_id {ids} must be distinct layer indices in "
                                  f"0..{len(layers) - 1}")
    if len(ids) != scheduler.random_ltd_layer_num:
        raise DataEfficiencyError(f"{BASE}.random_ltd_layer_num is {scheduler.random_ltd_layer_num} but "
                                  f"random_ltd_layer_id lists {len(ids)} layers")
    for position, index in enumerate(ids):
        layers[index].init_config(section, scheduler, position)
    for index, layer in enumerate(layers):
        if index not in ids:
            layer.random_ltd_scheduler = None
    return ids


def remove_random_ltd_state_dict(state_dict: dict) -> OrderedDict:
    """`state_dict` with DeepSpeed's wrapper segment (".random_ltd_layer") removed from every key: the
    unconverted model's keys (dsdata's wrappers add none, so its state dicts come back unchanged)."""
    out = OrderedDict()
    for key, value in state_dict.items():
        out[".".join(part for part in key.split(".") if part != WRAPPED)] = value
    return out


def save_without_random_ltd(model: Any) -> OrderedDict:
    """The model's state dict with the unconverted model's keys (DeepSpeed's helper; dsdata's keys are those)."""
    return remove_random_ltd_state_dict(_target(model).state_dict())
