"""DeepSpeed's module paths on dstrain.

Each module here exists because DeepSpeed scripts import it by DeepSpeed's name (`deepspeed.zero`,
`deepspeed.runtime.utils`, `deepspeed.moe.layer`, ...); it re-exports what dstrain's libraries
provide and holds no training logic. `alias.py` holds the tables: `MAPPED_PATHS` (what
`import dstrain.as_deepspeed` serves as `deepspeed.<path>`) and `PUBLIC_PATHS` (the DeepSpeed-shaped
names under `dstrain.` itself: `dstrain.zero`, `dstrain.comm`, `dstrain.pipe`, `dstrain.moe`, ...).
"""
