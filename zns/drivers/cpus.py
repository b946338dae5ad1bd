"""`zns serve --cpus`: where each process runs (sched_setaffinity). With a CPU list, each
process pinned to its CPU for good; with `auto` (the default), the state process and worker
1 paired on one CPU while their work is light (zns.core.pairing decides; `pair_sample`,
`pair` and `release` carry it out); with `off`, wherever the kernel puts them.

Why: a forwarded write is handed from its worker to the state process and back, and its
event from the worker to its libzmq I/O thread. When the process handed to sleeps on
another core that is idle, waking it costs more than the work itself: on a VM, 50-80 us
each, the time for the host to run that virtual CPU again. Pinned to one core, the state
process, worker 1 and its threads hand over by a context switch, and the worker finds the
state process's answer in its channel as soon as its own send returns: push latency p50 with
one worker +31 to +34 us over one process instead of +158 to +193 on the 2-core test VM
(docs/operations.md, *Pinning processes to CPUs*).

What it costs: the kernel no longer moves a pinned process off a core that other work keeps
busy; and the state process shares worker 1's core. So a list is for hosts whose cores are
given to zns, as in nginx (`worker_cpu_affinity`) and HAProxy (`cpu-map`); `auto` pins the
pair only while their work is light, and lets them go once it is not.

A process pins every thread it has, and the threads it starts later (libzmq's I/O threads,
the metrics server) inherit it; with a list, a worker forked from the pinned state process
pins itself again as it starts; with `auto`, a worker other than worker 1 lets itself go
(`release` of its own pid), and worker 1 stays where it was forked, beside the state
process. The list is checked once, when `zns serve` starts; a process started later (a
worker in place of a dead one) whose CPU is gone by then runs unpinned (`pin`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from zns.core.errors import InvalidSetting
from zns.core.pairing import Sample

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


def remember() -> set[int]:
    """The CPUs this process may run on before anything here pinned it: taken once, by the
    process that forks the others (so theirs is the same), and returned."""
    global _unpinned
    if _unpinned is None:
        _unpinned = os.sched_getaffinity(0)
    return _unpinned


def pin(cpu: int, who: str = "") -> bool:
    """Run the calling process on `cpu` only: every thread it has (a thread's affinity is
    its own) and so every thread they start later. False, logged, when the kernel refuses
    `cpu` now: `zns serve` checked the list at start (`check`), but a CPU can go offline,
    or the cpuset shrink, while it runs. A worker started in place of a dead one (or a
    supervised server started again) then runs on the CPUs `zns serve` started with:
    refused, it would fail every start, and its slot (with one worker, the whole
    NameServer) would serve nothing again; left as forked, it would share the state
    process's CPU."""
    unpinned = remember()
    named = f"{who} " if who else ""
    tasks = _tasks("self") or [0]  # no /proc: this thread, and those it starts
    try:
        _set(tasks, {cpu})
    except OSError as exc:  # EINVAL: `cpu` is offline or outside this process's cpuset
        try:  # the kernel keeps the part of it that is online and allowed
            _set(tasks, unpinned)
        except OSError:
            pass  # none of it is any more: where the kernel moved it
        log.warning("%snot pinned to CPU %d (--cpus), not one this process may run on now "
                    "(%s): it runs on CPUs %s", named, cpu, exc.strerror,
                    _ranges(sorted(os.sched_getaffinity(0))))
        return False
    log.info("%spinned to CPU %d (--cpus)", named, cpu)
    return True


# --- `--cpus auto`: the state process and worker 1 as a pair (zns.core.pairing) -----------


def can_pair() -> str:
    """Why this system cannot pair processes ("" when it can): the pairing reads each
    thread's run and wait times from /proc (schedstat) and moves them with
    sched_setaffinity."""
    if not hasattr(os, "sched_setaffinity"):
        return "no sched_setaffinity"
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"):
        return "no per-thread schedstat in /proc"
    return ""


def pair_sample(state_pid: int, worker_pid: int) -> Sample | None:
    """The counters `Pairing.on_sample` takes, read now; None when worker 1 is gone (or
    /proc cannot be read)."""
    threads: dict[int, tuple[int, int]] = {}
    for pid in (state_pid, worker_pid):
        tasks = _tasks(str(pid))
        if not tasks:
            return None  # gone (a zombie has no task left to list)
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as file:
                    ran, waited = file.read().split()[:2]
                threads[task] = (int(ran), int(waited))
            except (OSError, ValueError):
                continue  # a thread that ended meanwhile: its counts go with it
    try:
        allowed = remember()
        idle: dict[int, int] = {}
        tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")  # /proc/stat counts in ticks
        with open("/proc/stat", "rb") as file:
            for line in file:
                if not line.startswith(b"cpu") or line[3:4].isspace():
                    continue  # the lines of the whole and of other counts
                name, *ticks = line.split()
                cpu = int(name[3:])
                if cpu in allowed:  # idle and iowait: time nothing ran there
                    idle[cpu] = (int(ticks[3]) + int(ticks[4])) * tick_ns
    except (OSError, ValueError, IndexError):
        return None
    return Sample(worker_pid, threads, idle)


def pair(cpu: int, pids: Iterable[int]) -> bool:
    """Every thread of each process of `pids` on `cpu`; False (and where they were) when the
    kernel refuses it (the CPU went offline or left the cpuset since)."""
    tasks = {pid: _tasks(str(pid)) for pid in pids}
    try:
        for threads in tasks.values():
            _set(threads, {cpu})
    except OSError:
        release(list(tasks))
        return False
    return True


def release(pids: Iterable[int]) -> None:
    """Every thread of each process of `pids` on the CPUs `zns serve` started with (of a
    pair let go; or of a worker other than worker 1, forked from a state process paired with
    it, which would share the pair's CPU)."""
    for pid in pids:
        try:
            _set(_tasks(str(pid)), remember())
        except OSError:
            pass  # none of them is allowed any more: where the kernel moved it


def _tasks(pid: str) -> list[int]:
    """The threads of process `pid` ("self": this one); none once it is gone."""
    try:
        return [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


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
