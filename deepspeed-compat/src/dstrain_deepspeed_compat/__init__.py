"""dstrain-deepspeed-compat: an environment where `import deepspeed`, `importlib.metadata.version("deepspeed")`
and the `deepspeed` commands are dstrain, so Hugging Face Transformers, Accelerate and DeepSpeed applications
run on it unchanged. Installed only by choice (`pip install ./deepspeed-compat`); refused beside a real DeepSpeed.

Importing this package loads nothing else: `dstrain_deepspeed_compat.pth` imports `.startup` in every Python of
the environment, and that must stay cheap.
"""

from ._version import DEEPSPEED_API_VERSION, __version__

__all__ = ["DEEPSPEED_API_VERSION", "__version__"]
