"""The run's layout: world = pipe x tensor x data (dscomm.ParallelDims), read from the config once
by initialize(). A layout an engine cannot run is refused by the key that asks for it."""

from __future__ import annotations

import dscomm
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError

# The axes the plain engine cannot spread over yet: only one rank along each.
ENGINE_RUNS_ONLY_ONE = ("pipeline.stages",)


def data_parallel_size(source_degrees: dict[str, int], world_size: int) -> int:
    """The data-parallel size a config's batch triple resolves at: the world over pipe x tensor (the world
    itself when they do not divide it; parallel_dims then names every factor)."""
    model = 1
    for degree in source_degrees.values():
        model *= max(int(degree), 1)
    return world_size // model if model and world_size % model == 0 else world_size


def requested_degrees(source) -> dict[str, int]:
    """pipeline.stages and tensor_parallel.autotp_size as a config source asks for them (before it is loaded
    at its data-parallel size); values that are not positive integers count as 1 (loading reports them)."""
    import dsconfig

    if isinstance(source, DeepSpeedConfig):
        raw = {"pipeline": {"stages": source.pipeline.stages},
               "tensor_parallel": {"autotp_size": source.tensor_parallel.autotp_size}}
    else:
        try:
            raw, _ = dsconfig.read_source(source)
        except ConfigError:
            return {}
    degrees = {}
    for section, key in (("pipeline", "stages"), ("tensor_parallel", "autotp_size")):
        value = raw.get(section, {}).get(key) if isinstance(raw.get(section), dict) else None
        degrees[f"{section}.{key}"] = value if isinstance(value, int) and not isinstance(value, bool) and value > 1 \
            else 1
    return degrees


def parallel_dims(degrees: dict[str, int], world_size: int, *, engine_runs_pipe: bool = False) -> dscomm.ParallelDims:
    """The layout of a run on `world_size` ranks: pipe x tensor x data from `degrees` (requested_degrees, with
    a PipelineModule's stages or a Megatron mpu's model-parallel size put in by initialize(): the degrees are
    read once). The plain engine runs pipe 1 x any tensor degree (dstp cuts the model over the tensor group,
    ZeRO partitions over the data group); `engine_runs_pipe`: the model is a PipelineModule, which the
    pipeline engine runs (without one, pipeline.stages above 1 is refused by key)."""
    degrees = {key: degrees.get(key, 1) for key in ("pipeline.stages", "tensor_parallel.autotp_size")}
    pipe, tensor = degrees.values()
    try:
        dims = dscomm.ParallelDims(world_size, pipe=pipe, tensor=tensor)
    except dscomm.CommError as exc:
        raise ConfigError([Problem(key, str(exc), value) for key, value in degrees.items() if value > 1]) from None
    unrunnable = [Problem(key, f"needs a {dims} layout, which only a pipeline engine runs: pass a "
                               f"dstrain.pipe.PipelineModule as the model, or remove the key or set it to 1", value)
                  for key, value in degrees.items() if value > 1 and key in ENGINE_RUNS_ONLY_ONE and not engine_runs_pipe]
    if unrunnable:
        raise UnsupportedFeatureError(unrunnable)
    return dims
