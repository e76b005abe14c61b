"""MonitorMaster: the one object a training loop hands its events to."""

import atexit
import contextlib
import functools
import operator
import weakref
from collections.abc import Iterable

from . import lifetime
from ._rank import current_rank
from .backends import CometMonitor, CSVMonitor, TensorBoardMonitor, WandbMonitor
from .backends.base import Backend
from .errors import MonitorConfigError, MonitorError
from .writer import BackendWorker


def _checked_value(value):
    if hasattr(value, "detach"):  # a tensor: converted on the writer thread, so no sync here
        if value.numel() != 1:
            raise MonitorConfigError(f"an event value must be a number or a one-element tensor, "
                                     f"got a tensor of shape {tuple(value.shape)}")
        return value.detach().clone()  # the caller may update its tensor in place afterwards
    try:
        return float(value)
    except (TypeError, ValueError):
        raise MonitorConfigError(f"an event value must be a number, got {value!r}") from None


def _checked(events: Iterable) -> list:
    batch = []
    for event in events:
        try:
            name, value, step = event
        except (TypeError, ValueError):
            raise MonitorConfigError(
                f"write_events takes a list of (name, value, step) tuples; got the item {event!r}") from None
        if type(name) is not str:
            raise MonitorConfigError(f"an event name must be a str, got {name!r} in {event!r}")
        if type(value) is not float:
            value = _checked_value(value)
        if type(step) is not int:
            try:
                step = operator.index(step)
            except TypeError:
                raise MonitorConfigError(f"an event step must be an integer, got {step!r} in {event!r}") from None
        batch.append((name, value, step))
    return batch


class MonitorMaster:
    """Fans events out to every enabled backend, on one rank, without blocking the caller.

    Takes dsconfig's section objects (or anything with the same attributes); `None` or
    `enabled=False` leaves a backend off. `write_rank` is the rank that writes (None: every rank,
    each into its own `rank<N>` sub-directory / run name). `extra_backends` are any objects with
    `name`, `write_events`, `flush` and `close` (see `Backend`), run like the built-in ones.
    Backends receive queued events every `write_interval` seconds, at flush() and at close();
    a backend more than `max_pending` batches behind drops new events (counted, warned once).
    Whatever was handed to write_events is written by the time the process ends, whether or not
    close() was called or the master is still referenced; with `flush_on_sigterm` (the default),
    on SIGTERM too (lifetime.py).
    """

    def __init__(self, tensorboard=None, wandb=None, comet=None, csv_monitor=None, *,
                 rank: int | None = None, write_rank: int | None = 0, max_pending: int = 10_000,
                 write_interval: float = 0.1,
                 close_timeout: float | None = 60.0, extra_backends: Iterable[Backend] = (),
                 flush_on_sigterm: bool = True) -> None:
        if not write_interval > 0:
            raise MonitorConfigError(f"write_interval must be a positive number of seconds, got {write_interval}")
        if max_pending < 1:
            raise MonitorConfigError(f"max_pending must be at least 1 batch, got {max_pending}")
        self.rank = current_rank() if rank is None else rank
        self.write_rank = write_rank
        self.close_timeout = close_timeout
        self.backends: dict[str, Backend] = {}
        self._workers: tuple[BackendWorker, ...] = ()
        self._closed = False
        self._exit_hook = None
        if write_rank is not None and self.rank != write_rank:
            return
        subdir = "" if write_rank is not None else f"rank{self.rank}"
        factories = (
            ("tensorboard", tensorboard, lambda cfg: TensorBoardMonitor(cfg, subdir=subdir)),
            ("wandb", wandb, lambda cfg: WandbMonitor(cfg, run_name=subdir or None)),
            ("comet", comet, CometMonitor),
            ("csv_monitor", csv_monitor, lambda cfg: CSVMonitor(cfg, subdir=subdir)),
        )
        try:
            for key, cfg, make in factories:
                if cfg is not None and cfg.enabled:
                    self.backends[key] = make(cfg)
            for backend in extra_backends:
                key = getattr(backend, "name", None)
                if not isinstance(backend, Backend) or not isinstance(key, str):
                    raise MonitorConfigError(
                        f"extra_backends must have a str name and write_events, flush and close methods; "
                        f"got {backend!r}")
                if key in self.backends:
                    raise MonitorConfigError(f"two backends are named {key!r}; backend names must be unique")
                self.backends[key] = backend
        except MonitorError:
            self._close_backends()
            raise
        except Exception as exc:
            self._close_backends()
            raise MonitorError(f"could not start the {key} monitor on rank {self.rank}: "
                               f"{type(exc).__name__}: {exc}") from exc
        self._workers = tuple(BackendWorker(b, max_pending, write_interval) for b in self.backends.values())
        lifetime.track(self._workers)
        # The exit hook holds the writers, not the master: a master dropped with the engine that made it
        # still has its queues written. Registered after the backends started: atexit runs hooks last-in
        # first-out, so this close runs before wandb's / comet's own exit hooks tear their runs down.
        self._exit_hook = functools.partial(lifetime.close_workers, self._workers, close_timeout)
        atexit.register(self._exit_hook)
        weakref.finalize(self, lifetime.drain, self._workers).atexit = False  # dropped: written now, not at exit
        if flush_on_sigterm:
            lifetime.install_sigterm_flush()

    @classmethod
    def from_config(cls, config, **kwargs) -> "MonitorMaster":
        """From a whole `dsconfig.DeepSpeedConfig` (its tensorboard, wandb, comet, csv_monitor)."""
        return cls(tensorboard=config.tensorboard, wandb=config.wandb, comet=config.comet,
                   csv_monitor=config.csv_monitor, **kwargs)

    @property
    def enabled(self) -> bool:
        """True when this rank writes to at least one backend."""
        return bool(self._workers)

    def write_events(self, events: Iterable) -> None:
        """Queue `[(name, value, step), ...]` for every backend; returns without waiting for I/O."""
        workers = self._workers
        if not workers:
            return
        if self._closed:
            raise MonitorError("write_events called after close(); open a new MonitorMaster")
        batch = _checked(events)
        for worker in workers:
            worker.submit(batch)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event written so far has reached every backend. False on timeout."""
        if self._closed:
            return True  # close() already wrote everything
        return all([worker.flush(timeout) for worker in self._workers])

    def close(self) -> None:
        """Write everything pending, then close every backend. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
        lifetime.close_workers(self._workers, self.close_timeout)

    def _close_backends(self) -> None:
        for backend in self.backends.values():
            with contextlib.suppress(Exception):  # already failing; the first error is the one to report
                backend.close()

    @property
    def dropped_events(self) -> dict[str, int]:
        """Events each backend dropped because its queue was full."""
        return {w.backend.name: w.dropped_events for w in self._workers}

    @property
    def failures(self) -> dict[str, int]:
        """How many writes / flushes each backend raised on."""
        return {w.backend.name: w.failures for w in self._workers}

    def __enter__(self) -> "MonitorMaster":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
