"""Asynchronous I/O for NVMe offload (the `aio` section)."""

import attrs

from ..fields import setting


@attrs.frozen
class AioConfig:
    block_size: int = setting(1048576, "I/O block size in bytes.", ge=1)
    queue_depth: int = setting(8, "I/O queue depth.", ge=1)
    # DeepSpeed documents `thread_count` but only reads `intra_op_parallelism`; here both names are
    # one setting (see `intra_op_parallelism` below and the alias in keys.py).
    thread_count: int = setting(1, "Intra-request parallelism: threads that split each read/write.", ge=1)
    single_submit: bool = setting(False, "Submit requests one at a time instead of as one batch.")
    overlap_events: bool = setting(True, "Submit without waiting for earlier requests to complete.")
    use_gds: bool = setting(False, "Use NVIDIA GPUDirect Storage (GPU only).")

    @property
    def intra_op_parallelism(self) -> int:
        return self.thread_count

    def handle_kwargs(self) -> dict:
        """The keyword arguments of `dsaio.aio_handle` this section stands for."""
        return {
            "block_size": self.block_size,
            "queue_depth": self.queue_depth,
            "single_submit": self.single_submit,
            "overlap_events": self.overlap_events,
            "intra_op_parallelism": self.thread_count,
        }
