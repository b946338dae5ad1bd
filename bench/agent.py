"""Benchmark: zns-agent.jar's budgets with real RocketMQ 5.3.3 brokers and clients.

One zns (`zns serve --remoting`), two real brokers (broker-a, broker-b) serving one topic,
and two copies of the same application (tests/interop/java/AgentProbe.java: a producer
sending 50 messages/s with send retries off, and a push consumer; RocketMQ's defaults
otherwise: 30 s route poll, 20 s rebalance), one with `-javaagent:zns-agent.jar`, one
without. A ZNS/1 watcher timestamps zns's route events.

- kill trials (N): SIGKILL one broker (alternately); time until the producer's publish
  info drops it, from the kill; then start it again and time, from zns's route event
  listing it, until the producer's publish info and the consumer's assigned queues
  include it. The first trials also wait for the application without the agent (its
  30 s poll), the reference; the application with the agent is measured in every trial.
- failed sends: per kill, the sends of each application that failed in the 30 s after
  it (send retries off), side by side for the kills both applications saw.
- wipe trials (N): `zns wipe-write-perm` of one broker; time from zns's route event until
  the producer stops writing to it (and `zns add-write-perm` until it writes again).
- idle: CPU time of the agent's threads over 30 s in which nothing changes; the heap held
  by the agent's objects (a class histogram of zns.agent.*) and its threads.

    python -m bench.agent [--quick] [--out DIR]
"""

from __future__ import annotations

import os
import re
import select
import signal
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

from bench.harness import REPO, BenchError, percentile
from bench.report import BenchResult, Figure, RunConfig, Target, cli

sys.path.insert(0, str(REPO / "tests" / "interop"))
import rocketmq  # noqa: E402  (tests/interop/rocketmq.py: the real RocketMQ processes)
import zns_agent  # noqa: E402  (tests/interop/zns_agent.py: the jar, the probe, zns)

RATE = 50  # sends/s of each application
FULL_KILLS, FULL_REFERENCE_KILLS, FULL_WIPES = 10, 2, 10
QUICK_KILLS, QUICK_REFERENCE_KILLS, QUICK_WIPES = 1, 0, 1
POLL_S = 30.0  # RocketMQ's default pollNameServerInterval
FAIL_WINDOW_S = 30.0
IDLE_S = 30.0

METHOD = """
RocketMQ 5.3.3 brokers (`BrokerStartup`, the interop harness's small JVMs) registered with
zns only; the application is `AgentProbe` with RocketMQ's default client settings but send
retries off, started twice, with and without `-javaagent:zns-agent.jar`. The application
reads its own client's tables every 5 ms and prints when they change (wall clock), so a
figure is the time until the client's state changed, not until a send happened to show it.
Kill figures start at the SIGKILL (zns's own detection included: the broker's connection
closes); join and wipe figures, and "zns's route event → ...", start when a ZNS/1 watcher
received zns's route event (a client that acted on it before that watcher read it counts as
0 ms: the watcher's own delay is measured by no clock here).
"""


def _sh(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "zns", *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise BenchError(f"zns {' '.join(args)}: {proc.stdout}{proc.stderr}")


def _since_event(wall_ms: float, event_at: float) -> float:
    """Ms from the watcher's receipt of zns's event (`event_at`, s) to a client's line at
    `wall_ms`. The watcher is a Python process on a loaded machine: it can read the event
    after the application already acted on it (seen: -35 ms). The change then took less
    than the watcher's own delay, which no clock here measures: such a sample counts as
    0 ms, never negative."""
    return max(0.0, wall_ms - event_at * 1000)


def _failed_between(p: zns_agent.Probe, start: float, end: float) -> int:
    return sum(1 for s in p.events("send") if not s["ok"] and start * 1000 <= s["wall_ms"] < end * 1000)


_REFRESHED = re.compile(r"refreshed \[(?P<topics>[^\]]*)\] \((?P<why>.*)\): event read at (?P<read>\d+), "
                        r"refreshed in (?P<ms>[\d.]+) ms(?: \((?P<detail>.*)\))?$")


def _agent_refresh(p: zns_agent.Probe, topic: str, since: float, wait: float = 10.0) -> tuple[float, float] | None:
    """(wall ms the agent read the event, ms after which the client's pull of `topic` had
    ended) of the agent's first refresh of `topic` for an event read at or after `since` (s),
    from its log=debug line (written when the whole refresh ends: waited for)."""
    def find() -> tuple[float, float] | None:
        for line in p.agent_lines():
            m = _REFRESHED.search(line)
            if m and topic in m.group("topics").split(", ") and int(m.group("read")) >= since * 1000:
                done = re.search(re.escape(topic) + r" \+([\d.]+) ms", m.group("detail") or "")
                return float(m.group("read")), float(done.group(1) if done else m.group("ms"))
        return None
    try:
        return rocketmq.wait_until(find, wait, "the agent's refresh line")
    except Exception:  # an older agent, or no refresh: the split is left out
        return None


def _split(out: dict[str, list[float]], key: str, p: zns_agent.Probe, topic: str, event_at: float,
           seen_ms: float) -> str:
    """Splits event → seen into zns → agent (the events socket), the client's own pull of the
    topic (its GET_ROUTEINFO_BY_TOPIC to zns and its table update; the application's topic
    is pulled first), and the rest (the probe's 5 ms look); appended to out[key + "_read" /
    "_pull" / "_rest"]."""
    # the agent and the watcher get the same event: an earlier line is another change's
    # (the next trial can start within half a second of the last one's event)
    found = _agent_refresh(p, topic, event_at - 0.1)
    if found is None:
        return "no refresh line"
    read_ms, pull_ms = found
    if read_ms < event_at * 1000:
        # The topic was already waiting for its pull (the agent's 100 ms gap between pulls of
        # one topic) when this event came: the line gives the first event's read time, not
        # this one's, so this change has no read time of its own to split by.
        return "folded into the pull of an event read {:.0f} ms earlier".format(event_at * 1000 - read_ms)
    parts = (read_ms - event_at * 1000, pull_ms, seen_ms - read_ms - pull_ms)
    if parts[2] < 0:
        # The probe saw the change before the agent's line says the pull ended: the pull's
        # end is timed after the client's call returns (its tables were updated earlier), on
        # a clock of whole milliseconds. The three parts do not add up: no split this trial.
        return "the probe saw it {:.1f} ms before the pull's logged end".format(-parts[2])
    for suffix, v in zip(("_read", "_pull", "_rest"), parts):
        out.setdefault(key + suffix, []).append(v)
    return "event→agent {:.0f} ms, client's pull {:.0f} ms, rest {:.0f} ms".format(*parts)


def _agent_heap(pid: int) -> tuple[float, int]:
    """(KiB of live objects of zns.agent.* classes, their class count), from jcmd's histogram."""
    proc = subprocess.run(["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=60)
    total = classes = 0
    for line in proc.stdout.splitlines():
        m = re.match(r"\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)", line)
        if m and m.group(3).startswith("zns.agent."):
            total += int(m.group(2))
            classes += 1
    return total / 1024, classes


def run(config: RunConfig) -> BenchResult:
    ok, reason = rocketmq.java_available()
    if not ok:
        raise BenchError(f"needs a JDK and Maven: {reason}")
    kills_n = QUICK_KILLS if config.quick else FULL_KILLS
    reference_n = QUICK_REFERENCE_KILLS if config.quick else FULL_REFERENCE_KILLS
    wipes_n = QUICK_WIPES if config.quick else FULL_WIPES
    jar = zns_agent.agent_jar()
    zns_agent.probe_classes()
    rocketmq.set_scratch_dir(config.workdir / "oneshot")
    out: dict[str, list[float]] = {k: [] for k in (
        "kill_agent", "kill_zns", "kill_plain", "join_agent", "join_plain", "assign_agent", "assign_plain",
        "fail_agent", "fail_plain", "fail_agent_all", "wipe_agent", "unwipe_agent", "kill_agent_after_zns",
        "drop_agent", "drop_plain", "kill_ended", "ended_zns")}
    with ExitStack() as stack:
        zns = zns_agent.Zns(config.workdir / "zns").start()
        stack.callback(zns.kill)
        group = stack.enter_context(rocketmq.ProcessGroup(config.workdir / "rocketmq"))
        brokers = {b.name: b for b in group.brokers(zns.addr, ["broker-a", "broker-b"])}
        watcher = zns_agent.RouteWatcher(zns.pub)
        stack.callback(watcher.close)
        topic = rocketmq.unique_topic("BenchAgent")
        for b in brokers.values():
            zns_agent.create_topic(topic, b.addr, zns.addr)
        both = set(brokers)
        watcher.wait_for(lambda ev: ev["topic"] == topic and zns_agent.route_brokers(ev) == both, 60,
                         "the topic on both brokers")
        common = dict(rate=RATE, retries=0, consumer="push", print_sends="true")
        agent = zns_agent.Probe(config.workdir, zns.addr, topic, agent=jar, agent_args="log=debug", **common)
        stack.callback(agent.kill)
        plain = zns_agent.Probe(config.workdir, zns.addr, topic, agent=None, **common)
        stack.callback(plain.kill)
        for p in (agent, plain):
            p.wait_for("publish", lambda ln: set(ln["brokers"]) == both, 90, "publishing to both brokers")
            p.wait_for("assigned", lambda ln: set(ln["brokers"]) == both, 90, "consuming from both brokers")
        agent.wait_agent_line("following zns events", 30)

        for i in range(kills_n):
            victim = ("broker-b", "broker-a")[i % 2]
            reference = i < reference_n
            killed_at, ended_at = _kill_timing_its_end(brokers[victim])
            brokers[victim].kill()  # reaps it
            ev_at = watcher.wait_for(lambda ev: ev["topic"] == topic and victim not in zns_agent.route_brokers(ev),
                                     30, "the route without the killed broker", since=killed_at)
            seen = agent.wait_for("publish", lambda ln: victim not in ln["brokers"], 60, "the agent's producer drops it",
                                  since=killed_at)
            out["kill_zns"].append((ev_at - killed_at) * 1000)
            out["kill_ended"].append((ended_at - killed_at) * 1000)
            if ev_at >= ended_at:  # else zns's event beat the pidfd's wake-up: the sockets
                out["ended_zns"].append((ev_at - ended_at) * 1000)  # close first; no sample
            out["kill_agent"].append(seen["wall_ms"] - killed_at * 1000)
            out["kill_agent_after_zns"].append(_since_event(seen["wall_ms"], ev_at))
            kill_split = _split(out, "kill", agent, topic, ev_at, seen["wall_ms"])
            dropped = agent.wait_for("assigned", lambda ln: victim not in ln["brokers"], 60,
                                     "the agent's consumer drops its queues", since=killed_at)
            out["drop_agent"].append(dropped["wall_ms"] - killed_at * 1000)
            if reference:
                gone = plain.wait_for("publish", lambda ln: victim not in ln["brokers"], POLL_S + 30,
                                      "the plain producer drops it (its poll)", since=killed_at)
                out["kill_plain"].append(gone["wall_ms"] - killed_at * 1000)
                # its consumer too (the poll, then the 20 s rebalance), so that its return shows
                dropped = plain.wait_for("assigned", lambda ln: victim not in ln["brokers"], 2 * POLL_S + 30,
                                         "the plain consumer drops its queues", since=killed_at)
                out["drop_plain"].append(dropped["wall_ms"] - killed_at * 1000)
                time.sleep(max(0.0, killed_at + FAIL_WINDOW_S - time.time()))
                out["fail_agent"].append(_failed_between(agent, killed_at, killed_at + FAIL_WINDOW_S))
                out["fail_plain"].append(_failed_between(plain, killed_at, killed_at + FAIL_WINDOW_S))
            restarted_at = time.time()
            old = brokers[victim]
            b = rocketmq.Broker(old.workdir, zns.addr, name=victim, config=old.config)
            group.procs.append(b)
            brokers[victim] = b.start(wait=False)
            joined = watcher.wait_for(lambda ev: ev["topic"] == topic and victim in zns_agent.route_brokers(ev),
                                      120, "the restarted broker in the route", since=restarted_at)
            used = agent.wait_for("publish", lambda ln: victim in ln["brokers"], 60, "the agent's producer uses it",
                                  since=joined - 1)
            assigned = agent.wait_for("assigned", lambda ln: victim in ln["brokers"], 60,
                                      "the agent's consumer is assigned its queues", since=joined - 1)
            for line in agent.agent_lines()[-4:]:
                config.log("    " + line)
            out["join_agent"].append(_since_event(used["wall_ms"], joined))
            out["assign_agent"].append(_since_event(assigned["wall_ms"], joined))
            join_split = _split(out, "join", agent, topic, joined, used["wall_ms"])
            refreshed = _agent_refresh(agent, topic, joined - 0.1)
            if refreshed is not None:
                out.setdefault("assign_after_pull", []).append(assigned["wall_ms"] - sum(refreshed))
            if not reference:
                out["fail_agent_all"].append(_failed_between(agent, killed_at, restarted_at))
            if reference:
                used = plain.wait_for("publish", lambda ln: victim in ln["brokers"], POLL_S + 30,
                                      "the plain producer uses it", since=joined - 1)
                assigned = plain.wait_for("assigned", lambda ln: victim in ln["brokers"], 2 * POLL_S + 30,
                                          "the plain consumer is assigned its queues", since=joined - 1)
                out["join_plain"].append(_since_event(used["wall_ms"], joined))
                out["assign_plain"].append(_since_event(assigned["wall_ms"], joined))
            config.log(f"    route event at {joined:.3f}, assigned at {assigned['wall_ms'] / 1000:.3f}")
            config.log(f"kill {i + 1}/{kills_n} {victim}: zns {out['kill_zns'][-1]:.0f} ms, agent "
                       f"{out['kill_agent'][-1]:.0f} ms" + (f", plain {out['kill_plain'][-1]:.0f} ms" if reference else "")
                       + f"; back: producer {out['join_agent'][-1]:.0f} ms, consumer {out['assign_agent'][-1]:.0f} ms"
                       + (f" (plain {out['join_plain'][-1]:.0f} / {out['assign_plain'][-1]:.0f} ms)" if reference else ""))
            config.log(f"    kill: {kill_split}; join: {join_split}")
            both_now = set(brokers)
            agent.wait_for("publish", lambda ln: set(ln["brokers"]) == both_now, 60, "both again", since=joined - 1)

        for i in range(wipes_n):
            target = ("broker-a", "broker-b")[i % 2]
            started = time.time()
            _sh("wipe-write-perm", target, "--ns", zns.router)
            wiped = watcher.wait_for(lambda ev: ev["topic"] == topic
                                     and target not in zns_agent.route_brokers(ev, writable=True),
                                     30, "the wiped route", since=started)
            stopped = agent.wait_for("publish", lambda ln: target not in ln["brokers"], 30, "stops writing",
                                     since=wiped - 1)
            started = time.time()
            _sh("add-write-perm", target, "--ns", zns.router)
            added = watcher.wait_for(lambda ev: ev["topic"] == topic
                                     and target in zns_agent.route_brokers(ev, writable=True),
                                     30, "the restored route", since=started)
            # from the line that showed the wipe: an earlier line lists the broker too
            again = agent.wait_for("publish", lambda ln: target in ln["brokers"], 30, "writes again",
                                   since=max(added - 1, stopped["wall_ms"] / 1000 + 0.001))
            out["wipe_agent"].append(_since_event(stopped["wall_ms"], wiped))
            wipe_split = _split(out, "wipe", agent, topic, wiped, stopped["wall_ms"])
            out["unwipe_agent"].append(_since_event(again["wall_ms"], added))
            config.log(f"wipe {i + 1}/{wipes_n} {target}: stopped writing after {out['wipe_agent'][-1]:.0f} ms, "
                       f"writing again after {out['unwipe_agent'][-1]:.0f} ms ({wipe_split})")

        idle_probe = zns_agent.Probe(config.workdir, zns.addr, topic, agent=jar, rate=1, watch_ms=0)
        stack.callback(idle_probe.kill)
        idle_probe.wait_agent_line("following zns events", 60)
        time.sleep(2)
        before = zns_agent.thread_cpu_ms(idle_probe.pid, "zns-agent")
        before_own = zns_agent.thread_cpu_ms(idle_probe.pid, "zns-agent$")
        idle_s = 5.0 if config.quick else IDLE_S
        time.sleep(idle_s)
        idle_cpu = zns_agent.thread_cpu_ms(idle_probe.pid, "zns-agent") - before
        idle_own = zns_agent.thread_cpu_ms(idle_probe.pid, "zns-agent$") - before_own
        threads = sorted(n for n in zns_agent.thread_names(idle_probe.pid) if n.startswith("zns-agent"))
        heap_kib, heap_classes = _agent_heap(idle_probe.pid)
        config.log(f"idle: agent threads {threads} used {idle_cpu:.1f} ms CPU in {idle_s:.0f} s "
                   f"(its own thread {idle_own:.1f} ms); "
                   f"heap of zns.agent objects {heap_kib:.1f} KiB in {heap_classes} classes")
    return result(out, kills_n, reference_n, wipes_n, idle_cpu, idle_own, idle_s, threads, heap_kib, heap_classes)


def _kill_timing_its_end(broker: rocketmq.Broker) -> tuple[float, float]:
    """SIGKILL `broker`'s JVM; returns (when it was killed, when its process had ended), both
    time.time(). The end is read from a pidfd, which the kernel signals after the process's
    last thread has released its files: its sockets are closed by then (and its address
    space torn down before them), so zns cannot have learned of the death earlier."""
    assert broker.proc is not None
    pid = broker.proc.pid
    fd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        if not poller.poll(30_000):
            raise BenchError(f"the killed broker {pid} did not end within 30 s")
        return killed_at, time.time()
    finally:
        os.close(fd)


def _p99(xs: list[float]) -> list[float]:
    return [percentile(sorted(xs), 99)] if xs else [float("nan")]


def result(out: dict[str, list[float]], kills_n: int, reference_n: int, wipes_n: int, idle_cpu: float,
           idle_own: float, idle_s: float, threads: list[str], heap_kib: float, heap_classes: int) -> BenchResult:
    plain = "the same application without the agent"

    def fig(name: str, key: str, budget: float | None, ref_key: str | None, note: str = "") -> list[Figure]:
        ref = out.get(ref_key, []) if ref_key else []
        target = Target("value", "<=", budget) if budget is not None else None
        figures = [Figure(f"{name}, p99 of {len(out[key])} trials", "ms", _p99(out[key]),
                          plain if ref else "", _p99(ref) if ref else [], target, note)]
        figures.append(Figure(f"{name}, each trial", "ms", out[key], plain if ref else "", ref,
                              note="median with min–max; the reference's over its own trials"))
        return figures

    figures: list[Figure] = []
    figures += fig("broker SIGKILL → zns publishes the route without it", "kill_zns", None, None,
                   "the kernel closes a killed JVM's sockets while it tears the process down (its large "
                   "mappings first): the floor under every figure that starts at the kill")
    if out["kill_ended"]:
        figures += fig("broker SIGKILL, split: the kill → the kernel has ended the process (pidfd)", "kill_ended",
                       None, None, "the kernel's part: the sockets are closed before the pidfd says the "
                       "process ended")
    if out["ended_zns"]:
        figures += fig("broker SIGKILL, split: the process ended → zns's event at the watcher", "ended_zns", None,
                       None, "zns's part (the closed connection noticed, the route rebuilt, the event sent) "
                       "plus the watcher's receipt; at most this, since the sockets closed a little earlier")
    figures += fig("zns's route event → the producer stops choosing the killed broker's queues",
                   "kill_agent_after_zns", 200.0, None, "what the agent adds: the event, the client's own pull")
    figures += fig("broker SIGKILL → the producer stops choosing its queues", "kill_agent", None, "kill_plain",
                   "from the kill, zns's detection included; without the agent: the 30 s route poll")
    figures += fig("broker SIGKILL → the push consumer drops its queues", "drop_agent", None, "drop_plain",
                   "from the kill; without the agent: the route poll, then the 20 s rebalance")
    figures += fig("broker joins → the producer uses its queues", "join_agent", 200.0, "join_plain",
                   "from zns's route event listing the restarted broker")
    figures += fig("broker joins → the push consumer is assigned its queues", "assign_agent", 1000.0, "assign_plain",
                   "from zns's route event; RocketMQ's rebalance runs at most once a second")
    figures += fig("wipeWritePerm → the producer stops writing to the broker", "wipe_agent", 200.0, None,
                   "from zns's route event (zns wipe-write-perm over ZNS/1; mqadmin is the same route change)")
    figures += fig("addWritePerm → the producer writes to the broker again", "unwipe_agent", None, None)
    parts = (("_read", "zns's event → the agent has read it (the events socket; the watcher got the same event)"),
             ("_pull", "the client's own refresh (its route request to zns, its table update)"),
             ("_rest", "refresh done → the probe saw the change (its 5 ms look)"))
    for key, what in (("kill", "SIGKILL"), ("join", "broker joins, producer"), ("wipe", "wipeWritePerm")):
        for suffix, part in parts:
            xs = out.get(key + suffix, [])
            if xs:
                figures.append(Figure(f"{what}, split: {part}, each trial", "ms", xs,
                                      note=f"max {max(xs):.0f} ms; from the agent's log=debug refresh lines"))
    if out.get("assign_after_pull"):
        xs = out["assign_after_pull"]
        figures.append(Figure("broker joins, consumer, split: the agent's refresh done → the consumer assigned "
                              "its queues (the client's heartbeat and rebalance), each trial", "ms", xs,
                              note=f"max {max(xs):.0f} ms"))
    if out["fail_agent"]:
        figures.append(Figure(f"failed sends in the {FAIL_WINDOW_S:.0f} s after a broker SIGKILL, send retries off, "
                              f"{RATE} sends/s", "sends", out["fail_agent"], plain, out["fail_plain"],
                              note="the same kills seen by both applications"))
    if out["fail_agent_all"]:
        figures.append(Figure("failed sends from a SIGKILL until the broker is back, with the agent", "sends",
                              out["fail_agent_all"], note="the trials without the reference"))
    figures.append(Figure(f"agent threads' CPU while nothing changes ({idle_s:.0f} s)", "ms", [idle_cpu],
                          target=Target("value", "<=", idle_s * 1000 * 0.001),
                          note=f"budget 0.1 % of a core; threads {', '.join(threads)} (JeroMQ's I/O thread "
                               "handles each hb as it comes); /proc per-thread schedstat, ns"))
    figures.append(Figure(f"the agent's own thread's CPU while nothing changes ({idle_s:.0f} s)", "ms", [idle_own],
                          note="it reads the hb socket every third hb and the clients' tables every 10 s at most"))
    figures.append(Figure("heap held by the agent's objects (live, after a full GC)", "KiB", [heap_kib],
                          note=f"{heap_classes} classes of zns.agent.* (JeroMQ shaded included) have live "
                               "instances; JeroMQ's socket buffers are JDK classes and not counted"))
    params = (f"Parameters: {kills_n} kill trials ({reference_n} also timed without the agent), {wipes_n} wipe "
              f"trials, {RATE} sends/s per application, a {IDLE_S:.0f} s idle window.")
    return BenchResult("agent", "zns-agent.jar: pushed routes for an unmodified Java application",
                       METHOD + "\n" + params, figures)


if __name__ == "__main__":
    raise SystemExit(cli({"agent": run}))
