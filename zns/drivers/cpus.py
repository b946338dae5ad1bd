"""`zns serve --cpus`: each process pinned to its CPU (sched_setaffinity).

Why: a forwarded write is handed from its worker to the state process and back, and its
event from the worker to its libzmq I/O thread. When the process handed to sleeps on
another core that is idle, waking it costs more than the work itself: on a VM, 50-80 us
each, the time for the host to run that virtual CPU again. Pinned to one core, the state
process, worker 1 and its threads hand over by a context switch, and the worker finds the
state process's answer in its channel as soon as its own send returns: push latency p50 with
one worker +31 to +34 us over one process instead of +158 to +193 on the 2-core test VM
(docs/operations.md, *Pinning processes to CPUs*).

What it costs: the kernel no longer moves a pinned process off a core that other work keeps
busy; and the state process shares worker 1's core. So it is off by default, as in nginx
(`worker_cpu_affinity`) and HAProxy (`cpu-map`), for hosts whose cores are given to zns.

A process pins every thread it has, and the threads it starts later (libzmq's I/O threads,
the metrics server) inherit it; a worker forked from the pinned state process pins itself
again as it starts. The list is checked once, when `zns serve` starts; a process started
later (a worker in place of a dead one) whose CPU is gone by then runs unpinned (`pin`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from zns.core.errors import InvalidSetting

log = logging.getLogger("zns")


def check(cpus: Iterable[int]) -> None:
    """Refuse, in one line, a list with a CPU this process may not run on (offline, or
    outside its cpuset), before any process is pinned or forked."""
    if not hasattr(os, "sched_setaffinity"):
        raise InvalidSetting("cpus", "this system cannot pin a process to a CPU "
                                     "(no sched_setaffinity)")
    allowed = os.sched_getaffinity(0)
    refused = [cpu for cpu in cpus if cpu not in allowed]
    if refused:
        # As ranges: `0-8191` on a host of 2 CPUs is one short line, not 8,190 numbers.
        raise InvalidSetting("cpus", f"CPU {_ranges(sorted(refused))}: not one this "
                                     f"process may run on ({_ranges(sorted(allowed))})")


# The CPUs `zns serve` could run on before it pinned anything (as systemd's CPUAffinity= or
# taskset gave them): where a process whose CPU the kernel refuses runs instead. Set by the
# first `pin`, in the process that forks the others, so theirs is the same.
_unpinned: set[int] | None = None


def pin(cpu: int, who: str = "") -> bool:
    """Run the calling process on `cpu` only: every thread it has (a thread's affinity is
    its own) and so every thread they start later. False, logged, when the kernel refuses
    `cpu` now: `zns serve` checked the list at start (`check`), but a CPU can go offline,
    or the cpuset shrink, while it runs. A worker started in place of a dead one (or a
    supervised server started again) then runs on the CPUs `zns serve` started with:
    refused, it would fail every start, and its slot (with one worker, the whole
    NameServer) would serve nothing again; left as forked, it would share the state
    process's CPU."""
    global _unpinned
    if _unpinned is None:
        _unpinned = os.sched_getaffinity(0)
    named = f"{who} " if who else ""
    try:
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: this thread, and those it starts
        tasks = [0]
    try:
        _set(tasks, {cpu})
    except OSError as exc:  # EINVAL: `cpu` is offline or outside this process's cpuset
        try:  # the kernel keeps the part of it that is online and allowed
            _set(tasks, _unpinned)
        except OSError:
            pass  # none of it is any more: where the kernel moved it
        log.warning("%snot pinned to CPU %d (--cpus), not one this process may run on now "
                    "(%s): it runs on CPUs %s", named, cpu, exc.strerror,
                    _ranges(sorted(os.sched_getaffinity(0))))
        return False
    log.info("%spinned to CPU %d (--cpus)", named, cpu)
    return True


def _set(tasks: list[int], allowed: set[int]) -> None:
    for task in tasks:
        try:
            os.sched_setaffinity(task, allowed)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def _ranges(cpus: list[int]) -> str:
    """0,1,2,5 as 0-2,5 (as taskset and /proc say it)."""
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
