"""The run's layout: world = pipe x tensor x sequence x data (dscomm.ParallelDims), read from the config
once by initialize(). A layout an engine cannot run is refused by the key that asks for it."""

from __future__ import annotations

import dscomm
from dsconfig import ConfigError, DeepSpeedConfig, Problem

from ..errors import UnsupportedFeatureError

# The axes the plain engine cannot spread over yet: only one rank along each.
ENGINE_RUNS_ONLY_ONE = ("pipeline.stages",)
# The degrees a config asks for, by key: every one but data (the rest of the world).
DEGREE_KEYS = ("pipeline.stages", "tensor_parallel.autotp_size", "sequence_parallel_size")


def data_parallel_size(source_degrees: dict[str, int], world_size: int) -> int:
    """The data-parallel size a config's batch triple resolves at: the world over pipe x tensor x sequence
    (the world itself when they do not divide it; parallel_dims then names every factor). Sequence ranks
    split each sample, so they count once, as DeepSpeed counts them."""
    model = 1
    for degree in source_degrees.values():
        model *= max(int(degree), 1)
    return world_size // model if model and world_size % model == 0 else world_size


def requested_degrees(source) -> dict[str, int]:
    """pipeline.stages, tensor_parallel.autotp_size and sequence_parallel_size as a config source asks for
    them (before it is loaded at its data-parallel size); values that are not positive integers count as 1
    (loading reports them)."""
    import dsconfig

    if isinstance(source, DeepSpeedConfig):
        raw = {"pipeline": {"stages": source.pipeline.stages},
               "tensor_parallel": {"autotp_size": source.tensor_parallel.autotp_size},
               "sequence_parallel_size": source.sequence_parallel_size}
    else:
        try:
            raw, _ = dsconfig.read_source(source)
        except ConfigError:
            return {}
    degrees = {}
    for path in DEGREE_KEYS:
        value: object = raw
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        degrees[path] = value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1
    return degrees


def parallel_dims(degrees: dict[str, int], world_size: int, *, engine_runs_pipe: bool = False) -> dscomm.ParallelDims:
    """The layout of a run on `world_size` ranks: pipe x tensor x sequence x data from `degrees`
    (requested_degrees, with a PipelineModule's stages, a Megatron mpu's model-parallel size or a
    sequence-parallel mpu's size put in by initialize(): the degrees are read once). The plain engine runs
    pipe 1 x any tensor degree (dstp cuts the model over the tensor group, ZeRO partitions over the data
    group) or pipe 1 x tensor 1 x any sequence degree (ZeRO over sequence x data); `engine_runs_pipe`: the
    model is a PipelineModule, which the pipeline engine runs (without one, pipeline.stages above 1 is
    refused by key)."""
    degrees = {key: degrees.get(key, 1) for key in DEGREE_KEYS}
    pipe, tensor, sequence = degrees.values()
    try:
        dims = dscomm.ParallelDims(world_size, pipe=pipe, tensor=tensor, sequence=sequence)
    except dscomm.CommError as exc:
        raise ConfigError([Problem(key, str(exc), value) for key, value in degrees.items() if value > 1]) from None
    if sequence > 1 and (pipe > 1 or tensor > 1):
        other = "pipeline.stages" if pipe > 1 else "tensor_parallel.autotp_size"
        raise UnsupportedFeatureError([Problem("sequence_parallel_size", f"is not composed with {other} "
                                               f"({max(pipe, tensor)}) in this dstrain: Ulysses runs over sequence x "
                                               f"data ranks of whole models; set one of them to 1", sequence)])
    unrunnable = [Problem(key, f"needs a {dims} layout, which only a pipeline engine runs: pass a "
                               f"dstrain.pipe.PipelineModule as the model, or remove the key or set it to 1", value)
                  for key, value in degrees.items() if value > 1 and key in ENGINE_RUNS_ONLY_ONE and not engine_runs_pipe]
    if unrunnable:
        raise UnsupportedFeatureError(unrunnable)
    return dims
