"""The run's layout: world = pipe x tensor x data (dscomm.ParallelDims), read from the config once
by initialize(). A layout an engine cannot run is refused by the key that asks for it."""

from __future__ import annotations

import dscomm
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from .errors import UnsupportedFeatureError


def parallel_dims(cfg: DeepSpeedConfig, world_size: int) -> dscomm.ParallelDims:
    """The layout of a run of `cfg` on `world_size` ranks: pipe x tensor x data from pipeline.stages and
    tensor_parallel.autotp_size. The plain engine runs pipe 1 x tensor 1; any other layout is refused by key."""
    degrees = {"pipeline.stages": cfg.pipeline.stages if isinstance(cfg.pipeline.stages, int) else 1,
               "tensor_parallel.autotp_size": max(cfg.tensor_parallel.autotp_size, 1)}
    pipe, tensor = degrees.values()
    try:
        dims = dscomm.ParallelDims(world_size, pipe=pipe, tensor=tensor)
    except dscomm.CommError as exc:
        raise ConfigError([Problem(key, str(exc), value) for key, value in degrees.items() if value > 1]) from None
    unrunnable = [Problem(key, f"needs a {dims} layout, but this engine trains data parallel only (pipe 1 x "
                               f"tensor 1 x data {world_size}); remove the key or set it to 1", value)
                  for key, value in degrees.items() if value > 1]
    if unrunnable:
        raise UnsupportedFeatureError(unrunnable)
    return dims
