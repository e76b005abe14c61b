"""Capture and restore every random number generator a training step draws from, for exact resume."""

from __future__ import annotations

import random
from typing import Any

import torch


def capture() -> dict[str, Any]:
    """Python's, numpy's (when installed), torch's CPU and every CUDA device's generator state."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        pass
    else:
        state["numpy"] = numpy.random.get_state()
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        try:
            import numpy
        except ImportError:
            return
        numpy.random.set_state(state["numpy"])


def _as_python_state(value: Any) -> tuple:
    # A round trip through JSON or pickle may turn the inner tuple into a list.
    version, internal, gauss = value
    return version, tuple(internal), gauss
