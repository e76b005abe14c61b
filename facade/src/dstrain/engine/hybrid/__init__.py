"""The Hybrid Engine (`hybrid_engine`): an RLHF actor that trains and generates in one loop.

generation.py holds the part the engine composes (HybridGeneration); tensor_parallel.py the replica that
`inference_tp_size` > 1 generates on; lora.py LoRA's exact fusion; latency.py the split DeepSpeed prints.
"""

from .generation import HybridGeneration

__all__ = ["HybridGeneration"]
