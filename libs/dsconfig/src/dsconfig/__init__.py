"""dsconfig: DeepSpeed's ds_config.json as typed, validated, explained objects.

    cfg = dsconfig.load("ds_config.json", world_size=8)
    cfg.zero_optimization.stage, cfg.train_micro_batch_size_per_gpu

Imports only attrs and cattrs (no torch, no numpy) and reads nothing from the environment.
"""

from ._version import __version__
from .auto import RESOLVABLE as AUTO_RESOLVABLE
from .auto import resolve_auto
from .config import DeepSpeedConfig
from .elasticity import (
    ElasticityConfig,
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
    compute_elastic_config,
)
from .errors import ConfigError, ConfigWarning, Problem
from .fields import AUTO
from .jsonio import read_source
from .keys import requested_unsupported
from .loader import load, load_section
from .resources import MachineLimits, resource_problems
from .schema import json_schema
from .sections import (
    ActivationCheckpointingConfig,
    AioConfig,
    AutotuningConfig,
    BF16Config,
    CheckpointConfig,
    CheckpointParallelWriteConfig,
    CometConfig,
    CommsLoggerConfig,
    CompileConfig,
    CSVMonitorConfig,
    CurriculumLearningConfig,
    CurriculumMetricConfig,
    CurriculumScheduleConfig,
    DataEfficiencyConfig,
    DataRoutingConfig,
    DataSamplingConfig,
    DataTypesConfig,
    ExpertParallelConfig,
    FlopsProfilerConfig,
    FP16Config,
    HybridEngineConfig,
    LeafModuleConfig,
    LegacyCurriculumConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    OptimizerConfig,
    PipelineConfig,
    RandomLTDConfig,
    RandomLTDSchedule,
    RandomLTDScheduleConfig,
    RankWatchdogConfig,
    SchedulerConfig,
    TensorBoardConfig,
    TensorParallelConfig,
    TorchAutocastConfig,
    TPLayerSpec,
    TPPartitionConfig,
    WandbConfig,
    ZeroConfig,
)

DeepSpeedConfigError = ConfigError  # DeepSpeed's name

__all__ = [
    "AUTO",
    "AUTO_RESOLVABLE",
    "ActivationCheckpointingConfig",
    "AioConfig",
    "AutotuningConfig",
    "BF16Config",
    "CSVMonitorConfig",
    "CheckpointConfig",
    "CheckpointParallelWriteConfig",
    "CometConfig",
    "CommsLoggerConfig",
    "CompileConfig",
    "ConfigError",
    "ConfigWarning",
    "CurriculumLearningConfig",
    "CurriculumMetricConfig",
    "CurriculumScheduleConfig",
    "DataEfficiencyConfig",
    "DataRoutingConfig",
    "DataSamplingConfig",
    "DataTypesConfig",
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "ElasticityConfig",
    "ElasticityConfigError",
    "ElasticityError",
    "ElasticityIncompatibleWorldSize",
    "ExpertParallelConfig",
    "FP16Config",
    "FlopsProfilerConfig",
    "HybridEngineConfig",
    "LeafModuleConfig",
    "LegacyCurriculumConfig",
    "MachineLimits",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "PipelineConfig",
    "Problem",
    "RandomLTDConfig",
    "RandomLTDSchedule",
    "RandomLTDScheduleConfig",
    "RankWatchdogConfig",
    "SchedulerConfig",
    "TPLayerSpec",
    "TPPartitionConfig",
    "TensorBoardConfig",
    "TensorParallelConfig",
    "TorchAutocastConfig",
    "WandbConfig",
    "ZeroConfig",
    "__version__",
    "compute_elastic_config",
    "json_schema",
    "load",
    "load_section",
    "read_source",
    "requested_unsupported",
    "resolve_auto",
    "resource_problems",
]
