"""`deepspeed.moe.sharded_moe`: the gate, the routing layer and the gating functions (dsmoe's)."""

from dsmoe.gating import top1gating, top2gating, topkgating
from dsmoe.sharded_moe import MOELayer, TopKGate, gumbel_rsample, multiplicative_jitter

__all__ = ["MOELayer", "TopKGate", "gumbel_rsample", "multiplicative_jitter", "top1gating", "top2gating",
           "topkgating"]
