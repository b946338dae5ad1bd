"""`zns serve --supervise`: the server in a child process, and a new one when it dies of a signal.

Why it exists: libzmq 4.3.5 (and its master branch) aborts the whole process
(`Assertion failed: !_io_error`, SIGABRT) when a connection fails while libzmq
still holds a ZMTP PING its peer sent behind a full queue. Any peer that
speaks ZMTP can arrange that, on either port, and no socket option of the
server prevents it (docs/operations.md, *A peer can abort the server*). This
does not prevent it either: the server process still dies, with the routes it
held. The supervisor starts a new one, and that is a restart like any other: a
new epoch (clients pull everything again), the KV store read from its file
(every acknowledged write is in it), brokers registering again at their next
heartbeat (`known: false`).

Only a death by a signal the supervisor did not send is followed by a new
server (SIGABRT, SIGSEGV, the OOM killer's SIGKILL ...). An exit, whatever its
code, ends the supervisor with that code: a bad setting or a port in use would
fail again. SIGTERM and SIGINT stop the server and then the supervisor; SIGHUP
is passed on. A server that dies again within STABLE_S of its start waits twice
as long before the next one (up to MAX_DELAY_S), so a crash at start does not
spin.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("zns")

FIRST_DELAY_S = 0.1  # between a death and the next start
MAX_DELAY_S = 2.0
STABLE_S = 10.0  # a server that lived this long starts the delays over
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def pause(seconds: float, stopping: Callable[[], bool]) -> None:
    """Sleep `seconds`, in steps short enough that a stop is not kept waiting."""
    end = time.monotonic() + seconds
    while not stopping() and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def supervise(serve: Callable[[], int], *,
              wait: Callable[[float, Callable[[], bool]], None] = pause) -> int:
    """Run `serve()` in a forked child until it returns; fork another each time the child
    dies of a signal we did not send. Returns the child's exit code (128 + the signal when
    it died of one while stopping).

    A fork, not a new interpreter: the child starts with everything imported (a new
    interpreter spends 0.6-0.7 s of CPU on imports alone). The caller must have no
    threads and no ZeroMQ context yet.
    """
    stopping = False
    pid = 0  # the running child; 0 when there is none

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if pid:
            send_signal(pid, signal.SIGTERM)  # SIGINT from a terminal reached it already

    def reload(signum: int, _frame: FrameType | None) -> None:
        if pid:
            send_signal(pid, signal.SIGHUP)

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, ours in zip(SIGNALS, (stop, stop, reload)):
        signal.signal(sig, ours)
    delay, restarts = FIRST_DELAY_S, 0
    try:
        while True:
            started = time.monotonic()
            pid = _fork(serve, previous)
            if stopping:  # a stop that came before `pid` was set
                send_signal(pid, signal.SIGTERM)
            status = os.waitpid(pid, 0)[1]
            died, pid = pid, 0
            code = os.waitstatus_to_exitcode(status)
            if code >= 0 or stopping:
                return code if code >= 0 else 128 - code
            lived = time.monotonic() - started
            delay = (FIRST_DELAY_S if restarts == 0 or lived >= STABLE_S
                     else min(delay * 2, MAX_DELAY_S))
            restarts += 1
            log.error("the server (pid %d) died of %s after %.1f s: a new one starts in %.1f s "
                      "(restart %d; docs/operations.md, A peer can abort the server)",
                      died, _name(-code), lived, delay, restarts)
            wait(delay, lambda: stopping)
            if stopping:
                return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _fork(serve: Callable[[], int], handlers: dict[signal.Signals, Any]) -> int:
    """Fork a child that runs `serve()` and exits with what it returns; returns the child's
    pid. Signals wait until the child has its handlers (and the parent knows the pid): one
    in between would reach the wrong handler."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        return pid
    code = 1
    try:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        # Until the server has its own handlers, and again once it has restored these
        # after its last line, a stop ends the child at once. Ctrl-C reaches both
        # processes, so the supervisor's SIGTERM may come while the server closes: its
        # own handlers are still in place then (Server.run).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _exit_now)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        code = serve()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # nothing may raise past os._exit
            signal.signal(sig, signal.SIG_IGN)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _exit_now(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def send_signal(pid: int, signum: int) -> None:
    """Signal `pid`; one already gone is not an error."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
