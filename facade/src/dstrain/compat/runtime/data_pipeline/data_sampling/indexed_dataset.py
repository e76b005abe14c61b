"""`deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset`: Megatron's mmap indexed dataset (dsdata's)."""

from dsdata import (
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    close_mmap_dataset_builder,
    create_mmap_dataset_builder,
    find_fit_int_dtype,
)

__all__ = ["MMapIndexedDataset", "MMapIndexedDatasetBuilder", "close_mmap_dataset_builder",
           "create_mmap_dataset_builder", "find_fit_int_dtype"]
