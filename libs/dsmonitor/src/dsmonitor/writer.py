"""A background thread per backend, fed through a bounded queue.

The caller's side (`submit`) is a deque append, so training never waits on a disk or a network.
The writer wakes every `interval` seconds rather than per event: waking a thread on every call
cost the caller ~30 µs (the woken threads take the GIL), an append costs well under one. One
thread per backend means a backend that hangs or raises only loses its own events.
"""

import collections
import logging
import threading

from .backends.base import Backend

logger = logging.getLogger("dsmonitor")

_STOP = object()


def _as_float(value):
    # Tensors reach here unconverted so the caller never waits for a device sync.
    return float(value.item()) if hasattr(value, "item") else value


class BackendWorker:
    """Runs one backend's writes on its own daemon thread."""

    def __init__(self, backend: Backend, max_pending: int, interval: float = 0.1) -> None:
        self.backend = backend
        self.max_pending = max_pending
        self.interval = interval
        self._early_wake = max(1, max_pending // 2)  # a filling queue is drained without waiting
        self.dropped_events = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self._pending: collections.deque = collections.deque()
        self._stop_posted = False
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dsmonitor-{backend.name}", daemon=True)
        self._thread.start()

    # -- caller's thread ---------------------------------------------------------------------------
    def submit(self, events: list) -> None:
        pending = self._pending
        if len(pending) >= self.max_pending:
            if not self.dropped_events:
                logger.warning(
                    "dsmonitor: the %s monitor is %d batches behind; dropping new events rather than "
                    "slowing training (raise max_pending to keep more)", self.backend.name, self.max_pending)
            self.dropped_events += len(events)
            return
        pending.append(events)  # deque.append is atomic: no lock on the hot path
        if len(pending) >= self._early_wake and not self._wake.is_set():
            self._wake.set()

    def flush(self, timeout: float | None) -> bool:
        """Wait until everything submitted so far is written and the backend flushed."""
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        return done.wait(timeout)

    def request_stop(self) -> None:
        """Ask the thread to write what is pending, flush the backend and end; returns at once."""
        if not self._stop_posted:
            self._stop_posted = True
            self._pending.append(_STOP)
            self._wake.set()

    def close(self, timeout: float | None) -> bool:
        """Write what is pending, stop the thread, close the backend. False if it did not finish."""
        if self._closed:
            return True
        self.request_stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.error("dsmonitor: the %s monitor did not finish writing within %s s; "
                         "its remaining events are lost", self.backend.name, timeout)
            return False
        self._closed = True
        self._guarded(self.backend.close)
        return True

    # -- writer thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        pending = self._pending
        while True:
            self._wake.wait(self.interval)
            # Cleared before draining: a flush/close marker appended after this sets it again.
            self._wake.clear()
            batch: list = []
            while pending:
                item = pending.popleft()
                if isinstance(item, list):
                    batch.extend(item)  # one backend call for everything queued so far
                    continue
                self._write(batch)
                batch = []
                if item is _STOP:
                    self._guarded(self.backend.flush)  # on disk now, even if nobody waits for close()
                    return
                self._guarded(self.backend.flush)
                item.set()
            self._write(batch)

    def _write(self, batch: list) -> None:
        if batch:
            self._guarded(self.backend.write_events, [(n, _as_float(v), s) for n, v, s in batch])

    def _guarded(self, call, *args) -> None:
        try:
            call(*args)
        except Exception as exc:  # a monitor must never take training down
            self.failures += 1
            self.last_error = exc
            if self.failures == 1:
                logger.error("dsmonitor: the %s monitor failed (%s: %s); the other monitors keep "
                             "writing and this one retries with later events", self.backend.name,
                             type(exc).__name__, exc)
