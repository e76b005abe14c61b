"""The node agent: runs one node's torchrun and guarantees that none of its processes outlive it.

    python _node.py [--watch-stdin] [--grace SECONDS] [--keeper] -- COMMAND...

It is started by the `dstrain` launcher on every node (as a local child, or as the remote command
of ssh/pdsh) and is run by path, so it imports nothing from dstrain and no torch. It stops the
job, escalating from SIGTERM to SIGKILL after `--grace` seconds, when it receives SIGINT, SIGTERM
or SIGHUP, and with `--watch-stdin` also when its standard input closes: the launcher holds the
other end, so a launcher that dies (even by SIGKILL) or an ssh connection that drops ends the
node's job instead of leaving it running. It is a child subreaper, so ranks re-parented after
their parent died are still found and stopped. Its exit code is the command's, or 128 + signal.

An agent killed by SIGKILL cannot stop anything, so it does not start COMMAND itself: it starts a
second copy of this script, the keeper (`--keeper`), which starts COMMAND and watches its stdin,
whose only writer is the agent. When the agent dies, by whatever signal, the keeper gets SIGTERM (its
parent-death signal) and sees end of file, and stops the job; when the keeper dies, torchrun gets
SIGTERM the same way, and the agent inherits torchrun and the ranks (as their subreaper) and stops
them. Parent-death signals are armed in everything we start (the ranks arm their own in _rank.py),
but they are not inherited, so a rank's own helpers are found by the subreapers instead: whichever of
keeper, agent and launcher is still alive adopts them and `_proctree.sweep` stops what it adopts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _proctree  # a sibling file: this script runs outside the dstrain package

_stop = threading.Event()
_reason: list[str] = []
_role = ["node agent"]  # or "node keeper": who speaks in our messages


def _request_stop(reason: str) -> None:
    if not _stop.is_set():
        _reason.append(reason)
        _stop.set()


def _on_signal(signum: int, _frame: object) -> None:
    _request_stop(signal.Signals(signum).name)


def _say(message: str) -> None:
    # The launcher may be gone (that may be why we stop): a closed pipe must not stop the cleanup.
    with contextlib.suppress(OSError, ValueError):
        print(f"dstrain {_role[0]}: {message}", file=sys.stderr, flush=True)


def _watch_stdin(reason: str) -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    _request_stop(reason)


def stop_tree(proc: subprocess.Popen, grace: float, child_grace: float) -> None:
    """SIGTERM our child (torchrun then stops its ranks; the keeper stops torchrun), wait up to
    `child_grace`, then SIGTERM whatever is left and SIGKILL the stragglers."""
    tree = _proctree.descendants(os.getpid())  # before signalling: afterwards the links break
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=child_grace)
    # Helpers the ranks started in sessions of their own are not torchrun's to stop; orphans re-parented
    # to us while the ranks die are stopped as they arrive.
    _proctree.sweep(tree, min(grace, 3.0), own=(proc.pid,), everything=True)


def main(argv: list[str]) -> int:
    watch, grace, keeper = False, 10.0, False
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--watch-stdin":
            watch = True
        elif flag == "--grace":
            grace = float(argv.pop(0))
        elif flag == "--keeper":
            keeper = True
        else:
            _say(f"unknown option {flag!r}")
            return 2
    command = argv[1:]
    if not command:
        _say("no command given after '--'")
        return 2
    if keeper:
        _role[0] = "node keeper"
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    _proctree.become_subreaper()
    if watch:
        reason = "the node agent died" if keeper else "launcher connection closed"
        threading.Thread(target=_watch_stdin, args=(reason,), daemon=True).start()
    if keeper:
        child, child_stdin, child_grace = command, subprocess.DEVNULL, grace
    else:
        # Our end of the keeper's stdin closes only when we exit: that is how it learns we died.
        child = [sys.executable, "-u", os.path.abspath(__file__), "--keeper", "--watch-stdin",
                 "--grace", str(grace), "--", *command]
        child_stdin, child_grace = subprocess.PIPE, grace + 4.0  # the keeper's own stop takes up to grace + 3
    try:
        # A session of its own: a signal to our process group (a terminal's Ctrl-C, `kill -9 -PGID`)
        # never reaches both the agent and the keeper, so one of them is always left to clean up.
        # Its parent-death signal stops it when we die, even by SIGKILL.
        proc = subprocess.Popen(child, stdin=child_stdin, start_new_session=True,
                                preexec_fn=_proctree.dies_with_parent(signal.SIGTERM))
    except OSError as exc:
        _say(f"cannot start {child[0]!r}: {exc}")
        return 127
    try:
        while proc.poll() is None and not _stop.wait(0.1):
            pass
        if proc.poll() is None and not (keeper and _reason[0].startswith("SIG")):  # the agent says it once
            _say(f"stopping the job ({_reason[0]})")
    finally:
        stop_tree(proc, grace, child_grace)  # also after a normal exit: sweeps anything a rank left running
    code = proc.wait()
    _proctree.reap_orphans()
    if _reason and _reason[0].startswith("SIG"):
        return 128 + signal.Signals[_reason[0]].value
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
