"""A watchdog for ranks that stop answering: a SIGSTOPped process, a frozen host, a rank gone without a word.

    dscomm.watchdog.start(timeout_s=240)      # on every rank, after init_distributed (dstrain.initialize does)
    dscomm.watchdog.record("step 12: backward")   # what this rank is doing now: one assignment, no I/O

Without it such a job waits silently in its next collective until the process group's timeout (30
minutes by default) and longer where a backend never times out. With it, every rank's heartbeat
thread adds to its counter in the process group's store (its own connection, so it never waits behind
the main thread) every `timeout / 8` seconds (at most 5), and publishes what the rank last recorded
doing, and its last collective, when that changed. Each rank watches the next few ranks' counters; one
that has not moved for `timeout` seconds is named, with what it was last doing, in a verdict in the
store. Every rank reads the verdict, logs it (logger "dscomm", level ERROR) and ends its process with
exit code 75 (EX_TEMPFAIL: the job may be retried), since its main thread is blocked in a collective
that cannot be interrupted; a launcher then stops the rest, the stopped rank included. The process
group's own timeout is left as it is. A rank that leaves normally (`stop()`, `dscomm.destroy()`, or at
exit) says so first, so that its silence is not taken for a stop; a store that stops answering (its
host stopped) ends the rank the same way. A rank whose collective fails first, because a peer already ended on
the verdict, ends on that verdict too (collectives' failure path looks for it), so every rank names the stall.

The heartbeat measures liveness, not progress: a rank busy in a long step, a slow checkpoint or a
compilation keeps beating and is never named.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dscomm")

DEFAULT_TIMEOUT_S = 240.0  # named within 4 minutes and a few seconds: under DeepSpeed's 30 silent ones
STALL_EXIT_CODE = 75  # os.EX_TEMPFAIL
MAX_INTERVAL_S = 5.0
WATCHED_PEERS = 4  # each rank watches the next few ranks; the verdict reaches everyone through the store

_doing: Any = None  # the last action recorded (str() describes it), with when
_doing_since = 0.0
_collective: tuple[str, Any] | None = None  # (op, group) of the last collective started
_active: Watchdog | None = None


def record(action: Any) -> None:
    """What this rank is doing now, for the watchdog's message should it stop: a string, or any object whose
    str() says it (formatted only when published). Costs one assignment; no I/O."""
    global _doing, _doing_since
    _doing, _doing_since = action, time.monotonic()


def record_collective(op: str, group: Any) -> None:
    """The collective this rank started last (dscomm's collectives call this)."""
    global _collective
    _collective = (op, group)


def current() -> str:
    """What this rank last recorded doing, as the watchdog publishes it."""
    parts = []
    if _doing is not None:
        parts.append(f"{_doing} (for {time.monotonic() - _doing_since:.1f} s)")
    if _collective is not None:
        from .collectives import describe_group

        op, group = _collective
        parts.append(f"its last collective: {op} over {describe_group(group)}")
    return "; ".join(parts) or "nothing recorded yet"


def active() -> Watchdog | None:
    return _active


def start(timeout_s: float = DEFAULT_TIMEOUT_S, *, interval_s: float | None = None,
          on_stall: Callable[[str], None] | None = None) -> Watchdog | None:
    """Start this rank's watchdog over the default process group (None in a world of one, or when the
    group has no store). Call it on every rank at the same point; calling it again restarts it.
    on_stall(message): what to do once a rank is named (default: log and end the process)."""
    global _active
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    if not timeout_s > 0:
        raise ValueError(f"watchdog timeout_s must be a positive number of seconds, got {timeout_s!r}")
    stop()
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        shared = _get_default_store()
    except (ImportError, RuntimeError, ValueError) as exc:
        log.warning("dscomm watchdog: not started: the process group has no store to beat through (%s)", exc)
        return None
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a launcher's store outlives a restarted job
    watchdog = Watchdog(shared, dist.get_rank(), dist.get_world_size(), float(timeout_s), interval_s=interval_s,
                        on_stall=on_stall or end_process, prefix=f"dscomm_watchdog/{restart}")
    watchdog.start()
    _active = watchdog
    return watchdog


def stop() -> None:
    """Stop this rank's watchdog, telling the others it left on purpose (dscomm.destroy() calls it)."""
    global _active
    watchdog, _active = _active, None
    if watchdog is not None:
        watchdog.stop()


def end_process(message: str) -> None:
    """The default reaction to a named rank: log on this rank and end the process now (exit code 75). The
    message reaches stderr even where logging is configured elsewhere: the process ends right after."""
    log.error(message)
    if not _logged_to_stderr(log):
        with contextlib.suppress(OSError):
            os.write(2, f"ERROR dscomm: {message}\n".encode(errors="replace"))
    for flushable in [*logging.getLogger().handlers, *log.handlers, sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):  # ending anyway
            flushable.flush()
    os._exit(STALL_EXIT_CODE)


def _logged_to_stderr(logger: logging.Logger) -> bool:
    """Whether an ERROR of `logger` is written to this process's stderr (no handler at all: logging's last resort)."""
    handlers = []
    current: logging.Logger | None = logger
    while current is not None:
        handlers += current.handlers
        current = current.parent if current.propagate else None
    if not handlers:
        return True
    for handler in handlers:
        stream = getattr(handler, "stream", None)
        with contextlib.suppress(Exception):
            if handler.level <= logging.ERROR and stream is not None and stream.fileno() == 2:
                return True
    return False


class Watchdog:
    """One rank's heartbeat and watch (see the module docstring). `store`: the process group's store."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout_s: float, *, interval_s: float | None = None,
                 on_stall: Callable[[str], None] = end_process, prefix: str = "dscomm_watchdog"):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.interval_s = interval_s if interval_s is not None else min(timeout_s / 8, MAX_INTERVAL_S)
        self.on_stall = on_stall
        self.prefix = prefix
        # Our own connection to the store: the main thread may wait in it (a group being made) holding its lock.
        clone = getattr(store, "clone", None)
        self.store = clone() if clone is not None else store
        with contextlib.suppress(Exception):  # a store without its own timeout keeps the group's
            self.store.set_timeout(datetime.timedelta(seconds=max(self.interval_s * 2, 1.0)))
        self.peers = [(rank + step) % world_size for step in range(1, min(world_size - 1, WATCHED_PEERS) + 1)]
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._round_began: float | None = None  # when the heartbeat's store round in progress began
        self._spoke = threading.Lock()  # one verdict per process, from either thread

    def key(self, what: str, rank: int | None = None) -> str:
        return f"{self.prefix}/{what}" if rank is None else f"{self.prefix}/{what}/{rank}"

    def start(self) -> None:
        self.store.set(self.key("who", self.rank), f"{socket.gethostname()} {os.getpid()}")
        self._thread = threading.Thread(target=self._run, name="dscomm-watchdog", daemon=True)
        self._thread.start()
        # A store whose host is stopped blocks a request far beyond the store's timeout: this thread notices.
        threading.Thread(target=self._judge_the_store, name="dscomm-watchdog-store", daemon=True).start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Say this rank leaves on purpose, then end the heartbeat (a no-op in a forked child)."""
        if os.getpid() != self.pid or self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s * 2 + 1)  # its last beat is counted before we say we left
            if self._thread.is_alive():
                return  # stuck in a request to an unanswering store: another one would hang this exit
        with contextlib.suppress(Exception):  # the store may be gone already: the peers then fail anyway
            # Left at this count: silent at it, the rank is not watched; a watchdog started again beats past it.
            self.store.set(self.key("done", self.rank), str(self.store.add(self.key("beat", self.rank), 0)))

    # ------------------------------------------------------------------------------------------ the loop
    def _run(self) -> None:
        last_answer = time.monotonic()
        seen = {peer: (-1, last_answer) for peer in self.peers}  # peer -> (its counter, when it last moved)
        while not self._stop.is_set():
            self._round_began = time.monotonic()
            try:
                verdict = self._beat_and_watch(seen, self._round_began)
                last_answer = time.monotonic()
            except Exception as exc:
                if _closed(exc):  # its host exited (a rank that finished first): gone, not stopped; nothing to watch
                    log.info("dscomm watchdog on rank %d: the process group's store closed; watching ends", self.rank)
                    return
                silent = time.monotonic() - last_answer
                verdict = None if silent < self.timeout_s else self._store_verdict(silent, exc)
            finally:
                self._round_began = None
            if verdict is not None:
                self._speak(verdict)
                return
            self._stop.wait(self.interval_s)

    def _judge_the_store(self) -> None:
        while not self._stop.wait(self.interval_s):
            began = self._round_began
            if began is not None and time.monotonic() - began >= self.timeout_s:
                self._speak(self._store_verdict(time.monotonic() - began, None))
                return

    def _store_verdict(self, silent_s: float, exc: BaseException | None) -> str:
        cause = f": {str(exc).strip().splitlines()[0]}" if exc is not None and str(exc).strip() else ""
        host = "torchrun's agent" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "rank 0"
        return (f"the process group's store stopped answering for {silent_s:.0f} s (watchdog timeout "
                f"{self.timeout_s:g} s): its host, {host} (or the machine it runs on), is stopped or unreachable"
                f"{cause}")

    def _speak(self, verdict: str) -> None:
        if self._stop.is_set() or not self._spoke.acquire(blocking=False):
            return
        self.on_stall(f"dscomm watchdog on rank {self.rank}: {verdict}; ending this rank (exit code "
                      f"{STALL_EXIT_CODE}) instead of waiting out the process group's timeout")

    def end_on_a_verdict(self, wait_s: float) -> None:
        """After a collective failed because a peer left: when a rank has named a stalled one (the peer that left
        may have been ending on that verdict), end this rank on the same verdict, so every rank reports the
        stall rather than some of them its aftermath. Waits up to `wait_s` for a verdict; returns without one."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.store.check([self.key("verdict")]):
                    self._speak(self.store.get(self.key("verdict")).decode(errors="replace"))
                    return
            except Exception:  # the store left with its host: no verdict to read
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(min(0.05, self.interval_s))

    def _beat_and_watch(self, seen: dict[int, tuple[int, float]], now: float) -> str | None:
        store = self.store
        store.add(self.key("beat", self.rank), 1)
        store.set(self.key("doing", self.rank), current())
        if store.check([self.key("verdict")]):
            return store.get(self.key("verdict")).decode(errors="replace")
        for peer in seen:
            count = store.add(self.key("beat", peer), 0)
            last, since = seen[peer]
            if count != last:
                seen[peer] = (count, now)
            elif count == 0 or self._left(peer, count):
                continue  # not started yet (a stop before that is the process group's to time out), or left
            elif now - since >= self.timeout_s:
                verdict = self._describe_stall(peer, count, now - since)
                store.compare_set(self.key("verdict"), "", verdict)  # the first rank to name one speaks for all
                return store.get(self.key("verdict")).decode(errors="replace")
        return None

    def _left(self, peer: int, count: int) -> bool:
        """Whether `peer` stopped its watchdog on purpose at this count (its silence means nothing)."""
        done = self._read(self.key("done", peer))
        return done is not None and done.isdigit() and count <= int(done)

    def _describe_stall(self, peer: int, count: int, silent_s: float) -> str:
        doing = self._read(self.key("doing", peer)) or "nothing recorded"
        who = self._read(self.key("who", peer))
        where = ""
        if who:
            host, _, pid = who.partition(" ")
            where = f" (process {pid} on {host}{_process_state(host, pid)})"
        heard = f"no heartbeat for {silent_s:.0f} s"
        return (f"rank {peer}{where} stopped answering: {heard} (watchdog timeout {self.timeout_s:g} s). "
                f"At its last heartbeat it was doing: {doing}")

    def _read(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode(errors="replace") if self.store.check([key]) else None
        except Exception:  # the message does without it
            return None


def _closed(exc: BaseException) -> bool:
    """Whether a store request failed because the store's host closed the connection (exited), not timed out."""
    text = str(exc).lower()
    return any(words in text for words in ("connection was likely closed", "broken pipe", "connection reset",
                                           "connection refused"))


def _process_state(host: str, pid: str) -> str:
    """How the named process is, where this rank can see it (the same host)."""
    if host != socket.gethostname() or not pid.isdigit():
        return ""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return ", gone"
    state = stat[stat.rfind(")") + 2:stat.rfind(")") + 3]
    return {"T": ", stopped (SIGSTOP)", "t": ", stopped by a debugger", "Z": ", exited", "D": ", in uninterruptible "
            "I/O"}.get(state, f", state {state}")
