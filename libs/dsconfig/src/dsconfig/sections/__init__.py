"""One attrs class per section of the DeepSpeed config reference."""

from .aio import AioConfig
from .data_efficiency import (
    CurriculumLearningConfig,
    CurriculumMetricConfig,
    CurriculumScheduleConfig,
    DataEfficiencyConfig,
    DataRoutingConfig,
    DataSamplingConfig,
    LegacyCurriculumConfig,
    RandomLTDConfig,
    RandomLTDSchedule,
    RandomLTDScheduleConfig,
)
from .misc import (
    ActivationCheckpointingConfig,
    AutotuningConfig,
    CheckpointConfig,
    CheckpointParallelWriteConfig,
    CompileConfig,
    RankWatchdogConfig,
)
from .monitor import (
    CometConfig,
    CommsLoggerConfig,
    CSVMonitorConfig,
    FlopsProfilerConfig,
    TensorBoardConfig,
    WandbConfig,
)
from .optim import OptimizerConfig, SchedulerConfig
from .parallel import (
    ExpertParallelConfig,
    HybridEngineConfig,
    PipelineConfig,
    TensorParallelConfig,
    TPLayerSpec,
    TPPartitionConfig,
)
from .precision import BF16Config, DataTypesConfig, FP16Config, TorchAutocastConfig
from .zero import LeafModuleConfig, OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig

__all__ = [
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
    "CurriculumLearningConfig",
    "CurriculumMetricConfig",
    "CurriculumScheduleConfig",
    "DataEfficiencyConfig",
    "DataRoutingConfig",
    "DataSamplingConfig",
    "DataTypesConfig",
    "ExpertParallelConfig",
    "FP16Config",
    "FlopsProfilerConfig",
    "HybridEngineConfig",
    "LeafModuleConfig",
    "LegacyCurriculumConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "PipelineConfig",
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
]
