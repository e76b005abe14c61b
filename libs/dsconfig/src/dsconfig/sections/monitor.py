"""Monitoring, communication logging and the flops profiler."""

from typing import Literal

import attrs

from ..fields import section, setting

DEFAULT_JOB_NAME = "DeepSpeedJobName"


@attrs.frozen
class TensorBoardConfig:
    enabled: bool = setting(False, "Write TensorBoard event files.")
    output_path: str | None = setting(None, "Directory of the logs; null means under the launching directory.")
    job_name: str = setting(DEFAULT_JOB_NAME, "Sub-directory of output_path for this job.")


@attrs.frozen
class WandbConfig:
    enabled: bool = setting(False, "Log to Weights & Biases.")
    group: str | None = setting(None, "W&B group of runs.")
    team: str | None = setting(None, "W&B team (entity).")
    project: str = setting("deepspeed", "W&B project.")


@attrs.frozen
class CometConfig:
    enabled: bool = setting(False, "Log to Comet.")
    workspace: str | None = setting(None, "Comet workspace.")
    project: str | None = setting(None, "Comet project.")
    samples_log_interval: int = setting(100, "Submit metrics every this many samples.", ge=1)
    experiment_name: str | None = setting(None, "Name of the Comet experiment.")
    api_key: str | None = setting(None, "Comet API key (prefer the COMET_API_KEY environment variable).")
    experiment_key: str | None = setting(None, "Key of the experiment: 32 to 50 alphanumeric characters.")
    online: bool | None = setting(None, "Log to the server (true) or to an offline experiment (false).")
    mode: Literal["get", "create", "get_or_create"] | None = setting(
        None, "get an existing experiment, create a new one, or get_or_create (Comet's default).")


@attrs.frozen
class CSVMonitorConfig:
    enabled: bool = setting(False, "Write one CSV file per event.")
    output_path: str | None = setting(None, "Directory of the files; null means under the launching directory.")
    job_name: str = setting(DEFAULT_JOB_NAME, "Sub-directory of output_path for this job.")


CommOp = Literal[
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
    "reduce_scatter", "all_to_all_single", "all_to_all", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "barrier",
]


@attrs.frozen
class CommsLoggerConfig:
    enabled: bool = setting(False, "Record every logged collective.")
    verbose: bool = setting(False, "Print every collective as it happens.")
    prof_all: bool = setting(True, "Profile all operations.")
    debug: bool = setting(False, "Append the caller's function name to each log_name.")
    prof_ops: list[CommOp] = section(list, "Operations to profile when prof_all is false.")


@attrs.frozen
class FlopsProfilerConfig:
    enabled: bool = setting(False, "Profile flops at profile_step (also enables wall_clock_breakdown).")
    profile_step: int = setting(1, "Global step at which to profile.", ge=1)
    module_depth: int = setting(-1, "Depth of the per-module breakdown; -1 means all depths.", ge=-1)
    top_modules: int = setting(1, "Number of top modules shown per depth.", ge=1)
    detailed: bool = setting(True, "Print the detailed per-module profile.")
    output_file: str | None = setting(None, "File to write the profile to; null prints to stdout.")
