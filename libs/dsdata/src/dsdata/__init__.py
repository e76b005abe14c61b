"""dsdata: DeepSpeed's data efficiency library on plain torch and numpy.

Curriculum learning (pacing schedules, the offline DataAnalyzer writing DeepSpeed's memory-mapped
indexed files, the DataSampler that draws each global batch within the current difficulty and resumes
exactly) and random layerwise token dropping (random-LTD). The facade (`dstrain`) wires them into the
engine from the config's `data_efficiency` and legacy `curriculum_learning` sections.
"""

from ._version import __version__
from .curriculum_scheduler import CurriculumScheduler
from .data_analyzer import DataAnalyzer
from .data_sampler import DataSampler, DeepSpeedDataSampler
from .distributed_analyzer import DistributedDataAnalyzer
from .errors import DataEfficiencyError
from .indexed_dataset import (
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    close_mmap_dataset_builder,
    create_mmap_dataset_builder,
    find_fit_int_dtype,
)
from .random_ltd import (
    RandomLayerTokenDrop,
    RandomLTDScheduler,
    configure_random_ltd,
    convert_to_random_ltd,
    effective_seq_length,
    random_ltd_layers,
    remove_random_ltd_state_dict,
    save_without_random_ltd,
)
from .sampled_loader import SampledDataLoader
from .schedules import fixed_discrete, fixed_linear, fixed_root, make_schedule
from .seqlen import reshape, seqlen_post_process, truncate

__all__ = ["CurriculumScheduler", "DataAnalyzer", "DataEfficiencyError", "DataSampler", "DeepSpeedDataSampler",
           "DistributedDataAnalyzer",
           "MMapIndexedDataset", "MMapIndexedDatasetBuilder", "RandomLTDScheduler", "RandomLayerTokenDrop",
           "SampledDataLoader", "__version__", "close_mmap_dataset_builder", "configure_random_ltd",
           "convert_to_random_ltd", "create_mmap_dataset_builder", "effective_seq_length", "find_fit_int_dtype",
           "fixed_discrete", "fixed_linear", "fixed_root", "make_schedule", "random_ltd_layers",
           "remove_random_ltd_state_dict", "reshape", "save_without_random_ltd", "seqlen_post_process", "truncate"]
