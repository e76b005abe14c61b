"""Data efficiency: curriculum learning (data_sampling) and random-LTD (data_routing)."""

from typing import Literal

import attrs

from ..fields import section, setting


@attrs.frozen
class RandomLTDScheduleConfig:
    require_steps: int | None = setting(None, "Steps to go from min_value to max_value.", ge=1)
    seq_per_step: int | None = setting(None, "The effective sequence length is a multiple of this.", ge=1)


@attrs.frozen
class RandomLTDSchedule:
    min_value: int | None = setting(None, "Effective sequence length at step 0.", ge=1)
    max_value: int | None = setting(None, "Final effective sequence length (usually the full length).", ge=1)
    schedule_type: Literal["fixed_linear"] = setting("fixed_linear", "Shape of the length schedule.")
    schedule_config: RandomLTDScheduleConfig = section(RandomLTDScheduleConfig, "Parameters of the schedule.")


@attrs.frozen
class RandomLTDConfig:
    enabled: bool = setting(False, "Enable random layerwise token dropping.")
    total_layer_num: int | None = setting(None, "Number of layers of the model.", ge=1)
    random_ltd_layer_num: int | None = setting(None, "Number of layers random-LTD applies to.", ge=0)
    random_ltd_layer_id: list[int] = section(list, "Ids of those layers; as many as random_ltd_layer_num.")
    model_mask_name: str | None = setting(None, "Keyword name of the attention mask argument.")
    model_type: Literal["decoder", "encoder"] | None = setting(None, "decoder or encoder.")
    hidden_state_order: Literal["batch_seq_dim", "seq_batch_dim"] | None = setting(
        None, "Layout of the hidden states.")
    random_ltd_schedule: RandomLTDSchedule = section(RandomLTDSchedule, "Schedule of the kept sequence length.")


@attrs.frozen
class DataRoutingConfig:
    enabled: bool = setting(False, "Enable data routing techniques.")
    random_ltd: RandomLTDConfig = section(RandomLTDConfig, "Random layerwise token dropping.")


@attrs.frozen
class CurriculumScheduleConfig:
    total_curriculum_step: int | None = setting(None, "Steps from min to max difficulty (fixed_linear, fixed_root).", ge=1)
    difficulty_step: int | None = setting(None, "Difficulty is a multiple of this (fixed_linear, fixed_root).", ge=1)
    root_degree: int | None = setting(None, "Degree of the root (fixed_root).", ge=1)
    difficulty: list[int] | None = setting(None, "Difficulty levels (fixed_discrete).")
    max_step: list[int] | None = setting(None, "Steps at which the level changes (fixed_discrete).")


CurriculumScheduleType = Literal["fixed_linear", "fixed_root", "fixed_discrete", "custom"]


@attrs.frozen
class CurriculumMetricConfig:
    index_to_sample_path: str | None = setting(None, "index_to_sample file of the data analysis.")
    index_to_metric_path: str | None = setting(None, "index_to_metric file of the data analysis.")
    difficulty_type: Literal["value", "percentile"] = setting("value", "Difficulty as an absolute value or a percentile.")
    clustering_type: Literal["schedule_based", "single_cluster"] = setting(
        "schedule_based", "Cluster samples by the schedule, or keep one cluster.")
    min_difficulty: int | None = setting(None, "Difficulty at the first step.")
    max_difficulty: int | None = setting(None, "Final difficulty.")
    schedule_type: CurriculumScheduleType | None = setting(None, "Pacing function.")
    schedule_config: CurriculumScheduleConfig = section(CurriculumScheduleConfig, "Parameters of the pacing function.")


@attrs.frozen
class CurriculumLearningConfig:
    enabled: bool = setting(False, "Enable curriculum learning.")
    data_cluster_path: str | None = setting(None, "Directory of the per-difficulty sample clusters.")
    curriculum_metrics: dict[str, CurriculumMetricConfig] = section(dict, "One entry per difficulty metric.")


@attrs.frozen
class LegacyCurriculumConfig:
    """The top-level `curriculum_learning` section of DeepSpeed before data_efficiency: sequence-length warmup."""

    enabled: bool = setting(False, "Enable the legacy curriculum.")
    curriculum_type: Literal["seqlen"] = setting(
        "seqlen", "The difficulty is the sequence length, passed to the model's forward as curriculum_seqlen.")
    min_difficulty: int | None = setting(None, "Difficulty at the first step.", ge=1)
    max_difficulty: int | None = setting(None, "Final difficulty.", ge=1)
    schedule_type: CurriculumScheduleType | None = setting(None, "Pacing function.")
    schedule_config: CurriculumScheduleConfig = section(CurriculumScheduleConfig, "Parameters of the pacing function.")


@attrs.frozen
class DataSamplingConfig:
    enabled: bool = setting(False, "Enable data sampling techniques.")
    num_epochs: int = setting(1000, "At most this many epochs of the dataset are iterated.", ge=1)
    num_workers: int = setting(0, "Data loader workers.", ge=0)
    curriculum_learning: CurriculumLearningConfig = section(CurriculumLearningConfig, "Curriculum learning.")


@attrs.frozen
class DataEfficiencyConfig:
    enabled: bool = setting(False, "Enable the data efficiency library.")
    seed: int = setting(1234, "Random seed of data sampling.", ge=0)  # numpy refuses negative seeds
    data_routing: DataRoutingConfig = section(DataRoutingConfig, "Data routing (random-LTD).")
    data_sampling: DataSamplingConfig = section(DataSamplingConfig, "Data sampling (curriculum learning).")
