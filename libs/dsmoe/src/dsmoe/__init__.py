"""dsmoe: Mixture of Experts with DeepSpeed's MoE layer API."""

from ._version import __version__
from .errors import MoEError

__all__ = ["MoEError", "__version__"]
