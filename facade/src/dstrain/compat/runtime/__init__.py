"""`dstrain.runtime`: DeepSpeed's `deepspeed.runtime` module paths that training scripts import from
(`runtime.utils`, `runtime.lr_schedules`, `runtime.config`, `runtime.dataloader`, `runtime.zero`, ...).
Each submodule re-exports what dstrain provides under DeepSpeed's name; it holds no logic of its own."""
