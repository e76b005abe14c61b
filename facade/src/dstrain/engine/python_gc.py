"""disable_python_gc: automatic cyclic garbage collection is off while any engine that asked for it lives.

The reference: collect once after engine initialization, disable automatic collection, and restore the
process's original state when the last engine using the option is destroyed. So the state is counted
per process, not per engine: destroying one engine leaves it off while another that asked is alive.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

_lock = threading.Lock()
_holders = 0
_enabled_before = True


def hold() -> Callable[[], None]:
    """Collect once and keep automatic collection off; returns the release (call it once)."""
    global _holders, _enabled_before
    with _lock:
        if _holders == 0:
            _enabled_before = gc.isenabled()
        _holders += 1
        gc.disable()
    gc.collect()
    released = False

    def release() -> None:
        nonlocal released
        global _holders
        with _lock:
            if released:
                return
            released = True
            _holders -= 1
            if _holders == 0 and _enabled_before:
                gc.enable()

    return release
