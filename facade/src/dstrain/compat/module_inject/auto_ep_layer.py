"""`deepspeed.module_inject.auto_ep_layer`: `AutoEPMoELayer`, DeepSpeed's name for the layer AutoEP puts in place of
each MoE block (the `expert_parallel` section), which is dsmoe's `AutoEPLayer`: scripts find the replaced blocks
with `isinstance(module, AutoEPMoELayer)`."""

from dsmoe.autoep import AutoEPLayer as AutoEPMoELayer

__all__ = ["AutoEPMoELayer"]
