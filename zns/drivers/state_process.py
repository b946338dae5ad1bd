"""The state process of `zns serve --workers N`: the only writer, with no public port.

It owns what a single process owns, except the sockets: the state machine (in
a `NameService`), the KV file, the expiry and stall timers, the warm-state
writer. Every command its state machine applies (a forwarded write, an expiry
step, a stall shift, a peer's hint that shortened a deadline, remoting
connections closed with a broker tied to one of them) is numbered and
sent to every worker
(`zns.core.replication.Primary` behind `PrimaryLink`), with the events it made
when they are few enough to ship (else each worker's replica makes its own); a
registration that changed nothing but liveness is sent as its `Renew`
(zns.core.state). The state process publishes no event and answers no read. It forks the workers
(zns.drivers.worker) and keeps N of them alive (`zns.core.workers.WorkerPool`):
one that dies is out of the commit fence at once (its channel reads EOF) and
replaced.

The public ports: the state process resolves a configured port of `*` or 0 to
one free port, and holds that port for as long as it runs with a TCP socket
bound with SO_REUSEPORT and never listening (so no connection can reach it,
and a worker started later binds the same port), and with the port's lock, an
abstract Unix socket name that another zns cannot take meanwhile (`reserve_port`,
zns.drivers.port_lock).
Its channels to the workers are unnamed socketpairs. So no outside peer can reach
this process at all, and none of libzmq's aborts can take the routes down: the
state process speaks no ZMTP.

Figures (zns.core.figures): each worker reports its own counts once a second;
the state process keeps the last report of each live worker and sends every
worker the whole (its own counts and readiness, every worker's state in the
replication, those reports) once a second, and at once when a worker first
reports (it has just started serving). A worker answers /metrics, /readyz and
`status` from it.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence

import msgspec
import zmq

from zns import __version__
from zns.core.addresses import parse_host_port, url_host
from zns.core.errors import BadRequest, EndpointError, ErrorReply, Internal
from zns.core.pairing import Pair, Pairing, Release
from zns.core.figures import (
    REPORT_INTERVAL_MS, Overview, StateFigures, WorkerFigures, decode_figures, worker_status,
)
from zns.core.figures import encode as encode_figures
from zns.core.readiness import Readiness
from zns.core.replication import MAX_SHIPPED_EVENTS, Primary, shipped_events
from zns.core.schema import encode
from zns.core.service import Frames, NameService
from zns.core.state import AnyCommand, CloseConnections, Outcome, Suspect, Write, decode_command
from zns.core.timers import ServerTimers
from zns.core.config import ServerConfig
from zns.core.workers import StartWorker, StopWorker, WorkerPool
from zns.drivers import cpus, state_file
from zns.drivers.descriptors import tcp_address, tcp_host_port
from zns.drivers.heap import HeapTrim, glibc_malloc_trim
from zns.drivers.kv_file import KvStore
from zns.drivers.metrics import require_library as metrics_library
from zns.drivers.logs import install_repeat_filter
from zns.drivers.loop import Loop, PollSet, Ready, Source
from zns.drivers.metrics import process_usage
from zns.drivers.port_lock import lock_name, lock_port, retried
from zns.drivers.replication_link import PrimaryLink, WrittenSeq, fork_worker
from zns.drivers.server import new_epoch
from zns.drivers.sockets import Waker, handle_signals
from zns.drivers.worker import Forked, WriteAnswer, connection_range, worker_main

log = logging.getLogger("zns")

STOP_GRACE_S = 5.0  # workers still alive this long after SIGTERM get SIGKILL
_encode = msgspec.msgpack.encode


class PrimaryService(NameService):
    """The state process's NameService: each command applied is replicated, but a peer's
    hint (`Suspect`) only when it shortened a deadline: one that did not changed nothing,
    and every worker forwards the hints it takes, so each hint arrives once per worker. A
    registration that changed nothing but liveness is replicated as the `Renew` its
    outcome carries (zns.core.state): a fleet's periodic re-registrations of unchanged
    topics cost the workers O(1) each instead of the whole registration again."""

    link: PrimaryLink | None = None
    heap: HeapTrim | None = None  # told of every event: replaced routes leave free heap
    # It publishes no event and answers no read: it encodes the events of a command only to
    # ship them with it (zns.core.replication.shipped_events), when they are few; those of
    # a larger one are counted and logged, and each worker's replica makes its own.
    max_encoded_events = MAX_SHIPPED_EVENTS

    def apply(self, command: AnyCommand) -> tuple[Outcome, Sequence[Frames]]:
        # Closed remoting connections that registered nothing change nothing: not replicated
        # (a client fleet connecting for routes and leaving made one command per worker turn
        # with a close, applied again by every worker).
        unchanged = type(command) is CloseConnections \
            and not self.state.ties_any(command.connections)
        result = super().apply(command)  # a refused command raises: nothing to replicate
        if self.heap is not None:
            self.heap.events_made(len(result[0].events))
        link = self.link
        if unchanged or (type(command) is Suspect and not result[0].shortened):
            return result
        if link is not None:
            now = _now()
            # The events go with the command, encoded here once (not by every worker, and
            # not after the worker applied it: it publishes them first). Nothing else here
            # reads them: a worker's forwarded write and the expiry steps publish nothing.
            outcome, frames = result  # no frames past MAX_SHIPPED_EVENTS: none shipped
            shipped = shipped_events(frames) if len(outcome.events) <= MAX_SHIPPED_EVENTS \
                else None
            renewal = outcome.renewal
            link.append(_encode(command if renewal is None else renewal), now, shipped)
        return result


def execute(service: PrimaryService, request: bytes, now: int) -> tuple[None, bytes]:
    """A worker's forwarded write: applied here (and so replicated); the answer its worker
    replies from once its replica has applied it."""
    try:
        command = decode_command(request)
        if type(command) is CloseConnections:
            service.connections_closed(command.connections)
            return None, _encode(WriteAnswer(outcome=Outcome()))
        if type(command) is Suspect:  # a peer's hint a worker took (§10); now, as a write's
            outcome, _ = service.apply(msgspec.structs.replace(command, now=now))
            if outcome.shortened:  # once, whatever the workers that took it
                log.info("peer hint: broker %s at %s suspected here", command.cluster,
                         command.addr)
            return None, _encode(WriteAnswer(outcome=outcome))
        if type(command) is not Write:
            raise BadRequest(f"a worker forwarded a {type(command).__name__}, not a write")
    except (msgspec.DecodeError, BadRequest) as exc:
        log.error("a worker forwarded something unreadable: %s", exc)
        return None, _encode(WriteAnswer(error=Internal("see the server log").reply(0)))
    rid = command.request.id
    try:  # apply, not write: the worker that has the sender logs the audit line
        outcome, _ = service.apply(Write(request=command.request, now=now,
                                         connection=command.connection))
    except ErrorReply as exc:
        if isinstance(exc, Internal):
            log.error("internal error on %s: %s", type(command.request).__name__, exc)
        return None, _encode(WriteAnswer(error=exc.reply(rid)))
    except Exception:
        log.exception("bug while applying a forwarded %s", type(command.request).__name__)
        return None, _encode(WriteAnswer(error=Internal("internal error; see the server log")
                                         .reply(rid)))
    # events: each replica's; the renewal: replicated already
    reply, outcome.reply, outcome.events, outcome.renewal = outcome.reply, None, [], None
    return None, _encode(WriteAnswer(outcome=outcome, reply=encode(reply)))


class Reservation:
    """A public port the state process holds (`reserve_port`): `sock`, the TCP socket, and
    `lock`, the port's lock named `name` (None when ports cannot be locked here: `unlocked`
    says why)."""

    def __init__(self, sock: socket.socket, name: str, lock: socket.socket | None,
                 unlocked: str) -> None:
        self.sock, self.name, self.lock, self.unlocked = sock, name, lock, unlocked

    def close(self) -> None:
        self.sock.close()
        if self.lock is not None:
            self.lock.close()

    def overlaps(self, other: Reservation) -> bool:
        """Whether a connection to one could reach the other: one port, and one address or
        a wildcard of its family (IPv6's, `::`, takes IPv4 too, unless it is IPv6 only:
        IPV6_V6ONLY, which net.ipv6.bindv6only sets by default). The kernel refuses two such
        listeners, so one process refuses them as two of its endpoints; two reservations that
        do not listen bind both, and their workers would share the connections."""
        (host, port), (other_host, other_port) = (
            sock.getsockname()[:2] for sock in (self.sock, other.sock))
        if port != other_port:
            return False
        if any(sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::"
               and not sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
               for sock in (self.sock, other.sock)):
            return True
        return self.sock.family == other.sock.family and (
            host == other_host or bool({"0.0.0.0", "::"} & {host, other_host}))


def reserve_port(endpoint: str) -> tuple[str, Reservation]:
    """`endpoint` (tcp://host:port) with a port of `*` or 0 made a free port, and what holds
    it: a socket never listening, with SO_REUSEPORT set once it is bound, and the port's
    lock. OSError (EADDRINUSE) when the port is taken, PortLocked when its lock is.

    Set before the bind, SO_REUSEPORT would let this bind join any listener of the same
    user on the port: a second `zns serve` on the same fixed ports would share them with
    the first, the kernel splitting connections between two NameServers that know nothing
    of each other. Bound without it, the bind fails (EADDRINUSE) while anything listens
    there; set after it, the workers' binds (SO_REUSEPORT too) still join this socket.
    SO_REUSEADDR stays: it passes over the TIME_WAIT connections of an instance just
    stopped, never over a listener. But it passes over another socket that does not
    listen either: a second zns reserving the port while none of the first one's workers
    listens (both started at the same moment, or the first one's only worker being
    replaced) would bind beside it. The lock refuses that one."""
    tcp = tcp_host_port(endpoint)
    assert tcp is not None, endpoint  # the config's ports are tcp:// endpoints
    host, port = tcp
    family, address = tcp_address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        # The address as the kernel names it: `localhost` and 127.0.0.1 take one lock.
        bound_host, bound_port = sock.getsockname()[:2]
        name = lock_name(family, bound_host, bound_port)
        lock, unlocked = lock_port(name)
    except BaseException:
        sock.close()
        raise
    return f"tcp://{host}:{bound_port}", Reservation(sock, name, lock, unlocked)


class StateProcess:
    """Made in the process that becomes the state process; `run()` until SIGTERM/SIGINT."""

    def __init__(self, config: ServerConfig) -> None:
        if config.metrics:
            metrics_library()  # refused here, in one line, not by every worker as it starts
        # A peer makes this process log too (each broker change, a hint that shortened a
        # deadline): its lines are held to the repeat filter as a single process's are
        # (`Server` installs it there; this process makes none). The workers fork with it.
        install_repeat_filter(log)
        self._reserved: list[Reservation] = []
        try:
            router = self._reserve(config.router)
            pub = self._reserve(config.pub)
            remoting = config.remoting
            if remoting:
                remoting = self._reserve(f"tcp://{remoting}",  # named as one process names it
                                         f"--remoting {remoting}")[len("tcp://"):]
            metrics = config.metrics
            if metrics:  # checked by the config: HOST:PORT, maybe http://
                host, port = parse_host_port(metrics, schemes=("http",))
                metrics = self._reserve(f"tcp://{url_host(host)}:{port}",
                                        f"--metrics {metrics}: cannot listen")[len("tcp://"):]
            followers = config.followers and self._reserve(config.followers)
        except EndpointError:
            self.close()
            raise
        if unlocked := sorted({r.unlocked for r in self._reserved if r.unlocked}):
            log.warning("ports not locked (%s): a second zns started on them while none of "
                        "this one's workers listens is not refused", "; ".join(unlocked))
        self.config = msgspec.structs.replace(config, router=router, pub=pub, remoting=remoting,
                                              metrics=metrics, followers=followers)
        self._stopping = False
        self.waker = Waker()
        now = self._now()
        self.kv = KvStore(config.kv_path)
        self.service = PrimaryService(self.kv, epoch=new_epoch(),
                                      started_at_ms=now, version=__version__,
                                      limits=config.limits)
        # /readyz, as in one process: none expected unless a state dump is restored.
        self.readiness = Readiness((), now, round(config.ready_grace_s * 1000))
        self.state = self._restore_state()
        self.reports: dict[int, WorkerFigures] = {}  # channel -> its worker's last figures
        self.link = PrimaryLink(Primary(now=now),
                                dump=self.service.state.dump,
                                dump_in_steps=lambda: self.service.state.dump_in_steps(),
                                execute=lambda worker, request: execute(
                                    self.service, request, self._now()),
                                dropped=self._dropped, reported=self._reported,
                                clock=self._now)
        self.service.link = self.link
        self.pool = WorkerPool(config.workers, now=now)
        self.slots: dict[int, int] = {}  # pid -> slot
        self.starts = 0  # workers started: each gets its own range of remoting connection ids
        self.pids: dict[int, int] = {}  # channel (PrimaryLink's worker id) -> pid
        self.timers = ServerTimers(self.service, now=now, heartbeat_interval_ms=round(
            config.heartbeat_interval_s * 1000))
        self.service.heap = HeapTrim(glibc_malloc_trim(), now)
        self.pairing: Pairing | None = None
        sources: list[Source] = [_Pool(self), _Expiry(self.timers), _Links(self.link),
                                 _Figures(self), self.service.heap]
        if config.pairs:
            if why := cpus.can_pair():
                log.warning("--cpus auto: the state process and worker 1 are not paired on "
                            "one CPU (%s)", why)
            else:
                self.pairing = Pairing(len(cpus.remember()))
        if self.state is not None:
            sources.append(self.state)
        self.loop = Loop(sources, clock=self._now, stall=self.timers, poll=PollSet())

    def run(self) -> None:
        restore_wakeup, restore_handlers = handle_signals(
            {signal.SIGTERM: self.stop, signal.SIGINT: self.stop, signal.SIGCHLD: self.waker.wake,
             signal.SIGHUP: self.reload_keys}, self.waker)
        log.info("zns state process (pid %d, epoch %s): %d workers serve requests on %s, "
                 "events on %s, RocketMQ remoting on %s", os.getpid(), self.service.epoch,
                 self.config.workers, self.config.router, self.config.pub,
                 self.config.remoting or "none")
        try:
            self.carry_out(self._now())  # the first workers
            self.loop.run(lambda: self._stopping)
        finally:
            try:
                self._stop_workers()
                if self.state is not None:
                    self.state.write_now()
            finally:
                restore_wakeup()
                restore_handlers()
                self.close()
                log.info("zns stopped")  # the same last line as one process: whatever the shape

    def _reserve(self, endpoint: str, refused: str = "") -> str:
        """`reserve_port`, held until `close`; EndpointError starting with `refused`
        (default: cannot bind `endpoint`), as one process says it, once the port or its lock
        is still in use after PORT_FREED_WAIT_S: the workers of a state process just
        killed leave as soon as they read its channel's end, and a restart must not be
        refused for the moment they take; another NameServer keeps it."""
        what = refused or f"cannot bind {endpoint}"

        def attempt() -> tuple[str, Reservation]:
            bound, reservation = reserve_port(endpoint)
            if any(reservation.overlaps(held) for held in self._reserved):
                # Two endpoints of this zns, one on a wildcard: refused at once, as one
                # process says it (the locks, one per address, do not see it).
                reservation.close()
                in_use = OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
                raise EndpointError(f"{what}: {in_use}")
            return bound, reservation

        # A lock this zns holds is another endpoint of its own: refused at once.
        bound, reservation = retried(attempt, what, own=lambda exc: any(
            held.name == exc.name for held in self._reserved))
        self._reserved.append(reservation)
        return bound

    def stop(self) -> None:
        self._stopping = True
        self.waker.wake()

    def reload_keys(self) -> None:
        """SIGHUP (`systemctl reload`): every worker re-reads its CURVE keys. Without this
        handler SIGHUP would end the state process (its default action)."""
        for pid in list(self.slots):
            _kill(pid, signal.SIGHUP)

    def close(self) -> None:
        for reservation in self._reserved:
            reservation.close()
        self._reserved.clear()
        if hasattr(self, "link"):
            self.link.close()
        if hasattr(self, "kv"):
            self.kv.close()  # and its file's lock
        state: state_file.StateWriter | None = getattr(self, "state", None)  # None: not made
        if state is not None:
            state.close()  # its dump's lock

    # --- workers --------------------------------------------------------

    def start_worker(self, slot: int, now: int) -> None:
        self.starts += 1
        connections = connection_range(self.starts)

        def main(channel: socket.socket, written: WrittenSeq) -> int:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # SIGHUP stays blocked (fork_worker) until the worker's Server installs its
            # handler: a key reload while it starts reaches it then.
            # The ports and their locks are this process's: the locks are free as soon as it
            # is gone, not once its last worker has read the end of its channel.
            for reservation in self._reserved:
                reservation.close()
            self.kv.disown()  # the KV file is this process's to write (its entries: copied)
            # The machine as forked, at the seq the state transfer will name (nothing is
            # applied between the fork and the worker's join): the worker serves it.
            return worker_main(self.config, slot + 1, channel, written,
                               started_at_ms=self.service.started_at_ms,
                               forked=Forked(self.link.primary.seq, self.service.state),
                               connections=connections)

        try:
            pid, worker = fork_worker(self.link, main, now, forked=True)
        except OSError as exc:
            log.error("cannot start worker %d: %s", slot + 1, exc)
            self.pool.start_failed(slot, now)
            return
        self.slots[pid] = slot
        self.pids[worker] = pid
        self.pool.started(slot, pid, now)
        log.info("worker %d started (pid %d, channel %d)", slot + 1, pid, worker)

    def reap(self, now: int) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.slots.pop(pid, None)
            for channel in [w for w, p in self.pids.items() if p == pid]:
                self.reports.pop(channel, None)
            self.pids = {w: p for w, p in self.pids.items() if p != pid}
            if slot is None:
                continue
            how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit code {os.waitstatus_to_exitcode(status)}")
            if not self.pool.stopping and not self._stopping:
                # The pool's own line says when the next one starts (1 s after a clean
                # exit: a stop signal to the state process may be on its way).
                log.warning("worker %d (pid %d) died (%s)", slot + 1, pid, how)
            self.pool.exited(pid, now, clean=os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)

    def carry_out(self, now: int) -> None:
        for action in self.pool.actions():
            match action:
                case StartWorker(slot=slot):
                    self.start_worker(slot, now)
                case StopWorker(pid=pid):
                    _kill(pid, signal.SIGTERM)

    def _stop_workers(self) -> None:
        self.pool.stop()
        self.carry_out(self._now())
        deadline = time.monotonic() + STOP_GRACE_S
        while self.slots and time.monotonic() < deadline:
            self.reap(self._now())
            time.sleep(0.02)
        for pid in list(self.slots):
            _kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self.slots.pop(pid)

    # --- figures (zns.core.figures) ---------------------------------------

    def _reported(self, worker: int, body: bytes) -> None:
        """A worker's own figures; its first (it serves now) is told to every worker at
        once, so its /readyz and `status` need not wait a second."""
        try:
            figures = decode_figures(body)
        except msgspec.DecodeError as exc:
            log.error("unreadable figures from worker channel %d: %s", worker, exc)
            return
        first = worker not in self.reports
        self.reports[worker] = figures
        if first:
            self.send_figures(self._now())

    def pair(self, now: int) -> None:
        """`--cpus auto`: this process's and worker 1's run and wait times, read on the
        figures' second (no wake-up of its own); zns.core.pairing decides whether the two
        share a CPU."""
        pairing = self.pairing
        if pairing is None or not pairing.enabled:
            return
        worker = next((pid for pid, slot in self.slots.items() if slot == 0), None)
        pids = [os.getpid()] if worker is None else [os.getpid(), worker]
        sample = None if worker is None else cpus.pair_sample(os.getpid(), worker)
        match pairing.on_sample(sample, now):
            case Pair(cpu=cpu, why=why):
                if cpus.pair(cpu, pids):
                    log.info("the state process and worker 1 share CPU %d while their work is "
                             "light (--cpus auto; last second: %s)", cpu, why)
                else:
                    pairing.refused()
                    log.warning("the state process and worker 1 could not be paired on CPU %d "
                                "(--cpus auto): the kernel refused it", cpu)
            case Release(why=why):
                cpus.release(pids)
                log.info("the state process and worker 1 run where the kernel puts them "
                         "again (--cpus auto; last second: %s)", why)

    def send_figures(self, now: int) -> None:
        """Every worker gets the whole: this process's figures and the workers' last ones."""
        self.link.broadcast(encode_figures(self.figures(now)), now)
        self.link.flush(now)

    def figures(self, now: int) -> Overview:
        primary = self.link.primary
        channel_of = {pid: channel for channel, pid in self.pids.items()}
        pid_of = {slot: pid for pid, slot in self.slots.items()}
        workers = []
        for slot in range(self.config.workers):
            pid = pid_of.get(slot, 0)
            channel = channel_of.get(pid)
            workers.append(worker_status(
                slot + 1, pid, loaded=channel in self.reports,
                applied=None if channel is None else primary.applied(channel), seq=primary.seq,
                oldest_unapplied_at=None if channel is None else primary.unapplied_since(channel),
                now=now))
        service = self.service
        times = self.kv.write_times
        ready, why = self.readiness.check(now, self._settled)
        pairing = self.pairing
        state = StateFigures(
            pid=os.getpid(), seq=primary.seq, fence=primary.fence, ready=ready, ready_why=why,
            stalls=self.timers.stalls, removals=dict(service.removals),
            kv_write_counts=list(times.counts), kv_write_seconds=times.total_seconds,
            worker_restarts=self.pool.restarts, transfers=primary.transfers,
            workers_dropped=primary.dropped, workers=workers,
            dumps_written=self.state.written if self.state else 0,
            dump_failures=self.state.failed if self.state else 0,
            paired_cpu=-1 if pairing is None or pairing.cpu is None else pairing.cpu,
            pair_releases=pairing.releases if pairing else 0, **process_usage())
        return Overview(state=state, reports=[self.reports[c] for c in sorted(self.reports)])

    def _settled(self, cluster: str, addr: str) -> bool:
        """A restored broker address registered again or is gone (as `Server._settled`)."""
        live = self.service.table.liveness(cluster, addr)
        return live is None or live.confirm_by is None

    def _dropped(self, worker: int, reason: str) -> None:
        """A worker out of the fence must not answer another read: end it (the pool starts
        another once it is reaped)."""
        self.reports.pop(worker, None)
        pid = self.pids.pop(worker, None)
        if pid is not None:
            _kill(pid, signal.SIGKILL)

    def _restore_state(self) -> state_file.StateWriter | None:
        config = self.config
        path = state_file.state_path_for(config.state_path, config.kv_path)
        if path is None:
            return None
        writer, dump = state_file.restored_writer(path, self.service, now=self._now(),
                                                  wall_ms=_wall_ms, wake=self.waker.wake,
                                                  clock=self._now)
        if dump is not None:
            # /readyz waits for each restored address to register again (or go).
            self.readiness = Readiness(
                [(a.cluster, a.addr) for a in dump.table.addresses], self._now(),
                round(config.ready_grace_s * 1000))
        return writer

    @staticmethod
    def _now() -> int:
        return _now()


def _now() -> int:
    return int(time.monotonic() * 1000)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


class _Expiry:
    """The expiry steps (replicated as commands); the `hb` events are each worker's."""

    what = "running timers"

    def __init__(self, timers: ServerTimers) -> None:
        self.timers = timers

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return self.timers.next_deadline()

    def run(self, ready: Ready, now: int, until: int) -> None:
        self.timers.on_timer(now, 0)  # the events are the workers' to publish (shipped: apply)


# Plain ints: or-ing zmq's flag enums on every pass costs more than the rest of it.
_READ, _READ_WRITE = int(zmq.POLLIN), int(zmq.POLLIN | zmq.POLLOUT)


class _Links:
    """Every worker's channel: what they sent, and writing what is pending."""

    what = "replicating"

    def __init__(self, link: PrimaryLink) -> None:
        self._link = link
        self._poll: PollSet | None = None
        self._watched: dict[int, int] = {}  # descriptor -> flags

    def attach(self, poll: PollSet) -> None:
        self._poll = poll

    def next_deadline(self, now: int) -> int | None:
        self._watch()
        link = self._link
        return now if link.dumping or link.behind else link.next_deadline()

    def run(self, ready: Ready, now: int, until: int) -> None:
        self._link.run(now, until)  # the writes it read past the slice: its next turn
        self._watch()

    def _watch(self) -> None:
        """Poll every channel for reading, and for writing while bytes are pending."""
        poll = self._poll
        assert poll is not None
        wanted = {c.fileno(): _READ_WRITE if c.pending else _READ
                  for c in self._link.channels.values()}
        for fd in [fd for fd in self._watched if wanted.get(fd) != self._watched[fd]]:
            poll.unregister(fd)
            del self._watched[fd]
        for fd, flags in wanted.items():
            if fd not in self._watched:
                poll.register(fd, flags, self)
                self._watched[fd] = flags


class _Pool:
    """Signals (SIGCHLD among them) wake it: it reaps, and starts what the pool asks for."""

    what = "starting workers"

    def __init__(self, process: StateProcess) -> None:
        self._process = process

    def attach(self, poll: PollSet) -> None:
        poll.register(self._process.waker.fd, zmq.POLLIN, self)

    def next_deadline(self, now: int) -> int | None:
        return self._process.pool.next_deadline()

    def run(self, ready: Ready, now: int, until: int) -> None:
        process = self._process
        process.waker.drain_if_woken(ready)
        process.reap(now)
        if process._stopping:  # `systemctl stop` signals every worker too: start none
            return
        process.pool.on_timer(now)
        process.carry_out(now)


class _Figures:
    """The whole's figures to every worker, once a second; and the pairing's sample."""

    what = "sending figures, pairing worker 1"

    def __init__(self, process: StateProcess) -> None:
        self._process = process
        self._due = 0

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        return self._due

    def run(self, ready: Ready, now: int, until: int) -> None:
        if now < self._due:
            return
        self._due = now + REPORT_INTERVAL_MS
        self._process.send_figures(now)
        self._process.pair(now)  # what it does, the next second's figures say


def _wall_ms() -> int:
    return round(time.time() * 1000)
