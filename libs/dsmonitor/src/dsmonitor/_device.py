"""Device synchronisation for timers and the profiler, without importing torch."""

import sys


def synchronize() -> None:
    """Wait for queued device work, so wall-clock times cover it; a no-op on CPU or without torch."""
    # A process that never imported torch has no device work to wait for.
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if torch.cuda.is_available():
        if torch.cuda.is_initialized():  # never create a CUDA context just to time something
            torch.cuda.synchronize()
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        accelerator.synchronize()


def memory_line() -> str:
    """` | mem_allocated: x GB | max_mem_allocated: y GB` on CUDA, else empty."""
    torch = sys.modules.get("torch")
    if torch is None or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return ""
    gib = 1024**3
    return (f" | mem_allocated: {torch.cuda.memory_allocated() / gib:.4f} GB"
            f" | max_mem_allocated: {torch.cuda.max_memory_allocated() / gib:.4f} GB")
