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
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("zns")

FIRST_DELAY_S = 0.1  # between a death and the next start
MAX_DELAY_S = 2.0
STABLE_S = 10.0  # a server that lived this long starts the delays over


def pause(seconds: float, stopping: Callable[[], bool]) -> None:
    """Sleep `seconds`, in steps short enough that a stop is not kept waiting."""
    end = time.monotonic() + seconds
    while not stopping() and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def supervise(command: Sequence[str], *,
              wait: Callable[[float, Callable[[], bool]], None] = pause) -> int:
    """Run `command` until it exits; start it again each time it dies of a signal we did not
    send. Returns its exit code (128 + the signal when stopped by one while stopping)."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # SIGINT from a terminal reached it already

    def reload(signum: int, _frame: object) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGHUP)

    handlers = {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: reload}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    delay, restarts = FIRST_DELAY_S, 0
    try:
        while True:
            started = time.monotonic()
            child = subprocess.Popen(list(command))
            if stopping:  # a signal that came before `child` was set
                child.send_signal(signal.SIGTERM)
            code = child.wait()
            if code >= 0 or stopping:
                return code if code >= 0 else 128 - code
            lived = time.monotonic() - started
            delay = (FIRST_DELAY_S if restarts == 0 or lived >= STABLE_S
                     else min(delay * 2, MAX_DELAY_S))
            restarts += 1
            log.error("the server (pid %d) died of %s after %.1f s: a new one starts in %.1f s "
                      "(restart %d; docs/operations.md, A peer can abort the server)",
                      child.pid, _name(-code), lived, delay, restarts)
            wait(delay, lambda: stopping)
            if stopping:
                return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
