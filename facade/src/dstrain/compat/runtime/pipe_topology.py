"""`deepspeed.runtime.pipe.topology`: process topologies and the pipeline grid (dscomm's)."""

from dscomm.grid import PipelineParallelGrid, prime_factors
from dscomm.topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

_prime_factors = prime_factors  # DeepSpeed's (private) name, which its tests and some scripts import

__all__ = ["PipeDataParallelTopology", "PipeModelDataParallelTopology", "PipelineParallelGrid", "ProcessTopology"]
