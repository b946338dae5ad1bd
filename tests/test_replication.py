"""zns.core.replication without sockets: a primary, replicas and the channels between them
simulated in one process, driven by random schedules (hypothesis) with an injected clock.

Commands and states are opaque to the objects under test; here command `seq` is
b"c<seq>" and a state dump is b"s<seq>", so a replica's content is checked by its seq.
Command `seq` makes the events `events_of(seq)`, which the primary ships in its `Apply`
or not (at random): a replica publishes the same either way.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from helpers import examples
from zns.core.replication import (
    Ack, Answer, Apply, ApplyCommand, Deliver, Drop, Execute, Fence, Forward, LoadState, Primary,
    MAX_LAG_SAMPLES, PrimaryAction, Publish, Received, Replica, ReplicaAction, Reply, Resync,
    SendState, SendToPrimary, State,
    decode_to_primary, shipped_events,
    decode_to_worker, encode,
)


def events_of(seq: int) -> list[bytes]:
    """What command `seq` makes: one event, none for every tenth."""
    return [] if seq % 10 == 0 else [b"e%d" % seq]


def completes(message: object) -> bool:
    """An `Apply`, or the last part of a state: the driver says it is written
    (zns.drivers.replication_link.written_mark)."""
    return isinstance(message, Apply) or isinstance(message, State) and (
        message.total < 0 or message.offset + len(message.dump) >= message.total)


@dataclass
class Node:
    """One worker: its replica, the model of its state machine and its two channels."""

    replica: Replica
    inbox: deque = field(default_factory=deque)  # primary -> worker, in order
    outbox: deque = field(default_factory=deque)  # worker -> primary, in order
    state: int = 0  # the seq its state machine is at
    loaded: bool = False
    published: list[int] = field(default_factory=list)
    replies: dict[int, bytes] = field(default_factory=dict)
    expected: dict[int, int] = field(default_factory=dict)  # token -> seq its write made


class Cluster:
    """A primary and its workers, with checks after every step."""

    def __init__(self, rng: random.Random, *, window: int = 4, tail: int = 8,
                 ack_timeout_ms: int = 1000, lossy: bool = False, shipped: float = 0.5) -> None:
        self.rng = rng
        self.shipped = shipped  # the share of commands whose events come in their Apply
        self.now = 0
        # States ("s<seq>") sent a byte a part, two unacknowledged at most.
        self.primary = Primary(now=0, window=window, max_tail_commands=tail,
                               max_tail_bytes=10_000, ack_timeout_ms=ack_timeout_ms,
                               chunk_bytes=1, transfer_window_bytes=2)
        self.window = window
        self.lossy = lossy
        self.nodes: dict[int, Node] = {}
        self.dead: set[int] = set()
        self.fences: list[int] = [0]
        self.seen = 0  # the highest seq whose event any worker published (a client saw)
        self.lost = False
        # Workers whose channel takes nothing for now (a full socket): what is sent to them
        # waits here, unwritten, until `release`.
        self.stuck: dict[int, list[Any]] = {}

    # --- steps ------------------------------------------------------------------

    def append(self) -> int:
        seq = self._append()
        self.carry_out()
        return seq

    def _append(self) -> int:
        """The next command, its events shipped or not (too large, in a real primary)."""
        seq = self.primary.seq + 1
        shipped = events_of(seq) if self.rng.random() < self.shipped else None
        return self.primary.append(b"c%d" % seq, self.now, shipped)

    def join(self) -> int:
        worker = self.primary.join(self.now)
        self.nodes[worker] = Node(Replica(max_held_bytes=1_000_000))
        self.carry_out()
        return worker

    def kill(self, worker: int) -> None:
        self.nodes.pop(worker)
        self.stuck.pop(worker, None)
        self.dead.add(worker)
        self.primary.leave(worker)
        self.carry_out()

    def to_worker(self, worker: int) -> None:
        node = self.nodes[worker]
        batch = [node.inbox.popleft() for _ in range(self.rng.randint(1, len(node.inbox)))]
        for body in batch:
            if self.lossy and self.rng.random() < 0.05:
                self.lost = True  # a channel never loses one: the checks of what is
                continue  # written no longer hold; the replica must notice the gap
            node.replica.on_message(decode_to_worker(body))
        self.run_replica(worker)

    def to_primary(self, worker: int) -> None:
        node = self.nodes[worker]
        for _ in range(self.rng.randint(1, len(node.outbox))):
            self.primary.on_message(worker, decode_to_primary(node.outbox.popleft()), self.now)
        self.carry_out()

    def forward(self, worker: int) -> None:
        node = self.nodes[worker]
        node.replica.forward(b"w")
        self.run_replica(worker)

    def read(self, worker: int) -> None:
        """A client's read at `worker`, as its driver answers one: it first takes in what is
        in its channel (`ReplicaLink.catch_up`: the channel loses nothing), then answers, or
        refuses while its replica waits for a state."""
        node = self.nodes[worker]
        if not node.loaded:
            return  # a worker answers nothing before its first state
        while node.inbox:
            node.replica.on_message(decode_to_worker(node.inbox.popleft()))
        self.run_replica(worker)
        if not node.replica.awaiting_state and not self.lost:
            assert node.state >= self.seen, "no read answers older than an event seen"

    def tick(self, ms: int) -> None:
        self.now += ms
        self.primary.on_timer(self.now)
        self.carry_out()

    # --- the drivers' part --------------------------------------------------------

    def carry_out(self) -> None:
        written: list[tuple[int, int]] = []
        for action in self.primary.actions():
            match action:
                case Deliver(worker=w, message=message):
                    if isinstance(message, Apply):
                        in_flight = sum(1 for b in self.nodes[w].inbox
                                        if isinstance(decode_to_worker(b), Apply))
                        assert in_flight < self.window, "a window holds at most `window` commands"
                    if isinstance(message, State):
                        parts = [m for m in map(decode_to_worker, self.nodes[w].inbox)
                                 if isinstance(m, State) and m.transfer == message.transfer]
                        assert sum(len(m.dump) for m in parts) < 2, \
                            "a transfer holds at most its window unacknowledged"
                    if w in self.stuck:
                        self.stuck[w].append(message)
                        continue
                    self.nodes[w].inbox.append(encode(message))
                    if completes(message):
                        written.append((w, message.seq))  # in its channel: as the driver says
                case SendState(worker=w, seq=seq):
                    assert seq == self.primary.seq, "a state is always the current one"
                    self.primary.dumped(w, seq, b"s%d" % seq)
                    self.carry_out()
                case Execute(worker=w, token=token):
                    seq = self._append()
                    self.nodes[w].expected[token] = seq
                    self.primary.answer(w, token, seq, b"r%d" % seq)
                    self.carry_out()
                case Drop(worker=w):
                    self.nodes.pop(w)
                    self.stuck.pop(w, None)
                    self.dead.add(w)
        for w, seq in written:
            self.primary.written(w, seq)
        self.check_fence()
        if written:
            self.carry_out()  # the fence it moved

    def run_replica(self, worker: int) -> None:
        node = self.nodes[worker]
        while actions := node.replica.actions():  # as the driver: `produced` may release events
            self._carry_out_replica(node, actions)

    def _carry_out_replica(self, node: Node, actions: list[ReplicaAction]) -> None:
        # A worker carries out a batch in one turn, serving nothing in between: what it
        # applies later in the batch counts as applied already.
        applying = [a.seq for a in actions if isinstance(a, (ApplyCommand, LoadState))]
        for index, action in enumerate(actions):
            match action:
                case ApplyCommand(seq=seq, command=command, produce=produce):
                    assert node.loaded, "nothing is applied before the first state"
                    assert seq == node.state + 1, "commands are applied in order, none twice"
                    assert command == b"c%d" % seq
                    node.state = seq
                    if produce:
                        node.replica.produced(seq, events_of(seq))
                case LoadState(seq=seq, dump=dump):
                    assert dump == b"s%d" % seq and seq >= node.state
                    node.state, node.loaded = seq, True
                case Publish(seq=seq, events=events):
                    assert events == events_of(seq) != []
                    assert max([node.state, *applying]) >= seq, \
                        "a worker publishes an event only in the turn that applies it, or after"
                    for other in self.nodes.values():
                        if other.loaded and other is not node and not self.lost:
                            assert self.reachable(other) >= seq, \
                                "an event is published only once every live worker has it"
                    assert not node.published or node.published[-1] < seq, \
                        "events are published in order, each once"
                    node.published.append(seq)
                    self.seen = max(self.seen, seq)
                case Reply(token=token, reply=reply):
                    seq = node.expected[token]
                    assert reply == b"r%d" % seq
                    assert node.state >= seq, "a write is answered once its worker can read it"
                    node.replies[token] = reply
                case SendToPrimary(message=message):
                    node.outbox.append(encode(message))

    def release(self, worker: int) -> None:
        """The stuck channel of `worker` takes everything sent to it."""
        for message in self.stuck.pop(worker):
            self.nodes[worker].inbox.append(encode(message))
            if completes(message):
                self.primary.written(worker, message.seq)
        self.carry_out()

    def reachable(self, node: Node) -> int:
        """The seq a worker is at once it took in its channel: applied, or written to it."""
        return max([node.state, *(m.seq for m in map(decode_to_worker, node.inbox)
                                  if completes(m))])

    def check_fence(self) -> None:
        fence = self.primary.fence
        assert fence >= self.fences[-1], "the fence never moves back"
        assert fence <= self.primary.seq
        self.fences.append(fence)
        for worker in self.primary.workers:
            node = self.nodes[worker]
            if node.loaded and not self.lost and not node.replica.awaiting_state:
                assert self.reachable(node) >= fence, "the fence never passes a live worker"

    def settle(self) -> None:
        """Deliver everything, losslessly, until nothing moves."""
        self.lossy = False
        for worker in list(self.stuck):
            if worker in self.nodes:
                self.release(worker)
            else:
                del self.stuck[worker]
        for _ in range(10_000):
            busy = [w for w, n in self.nodes.items() if n.inbox or n.outbox]
            if not busy:
                return
            for worker in busy:
                if worker in self.nodes and self.nodes[worker].inbox:
                    self.to_worker(worker)
                if worker in self.nodes and self.nodes[worker].outbox:
                    self.to_primary(worker)
        raise AssertionError("the cluster never settled")


def run_schedule(seed: int, steps: int, *, lossy: bool = False) -> Cluster:
    rng = random.Random(seed)
    cluster = Cluster(rng, window=rng.randint(1, 6), tail=rng.randint(1, 10), lossy=lossy)
    for _ in range(rng.randint(0, 3)):
        cluster.join()
    for _ in range(steps):
        roll = rng.random()
        alive = list(cluster.nodes)
        if roll < 0.3:
            cluster.append()
        elif roll < 0.55 and alive:
            worker = rng.choice(alive)
            if cluster.nodes[worker].inbox:
                cluster.to_worker(worker)
        elif roll < 0.75 and alive:
            worker = rng.choice(alive)
            if cluster.nodes[worker].outbox:
                cluster.to_primary(worker)
        elif roll < 0.80 and alive:
            worker = rng.choice(alive)
            if cluster.nodes[worker].loaded:
                cluster.forward(worker)
        elif roll < 0.82 and alive:
            cluster.read(rng.choice(alive))
        elif roll < 0.86 and alive:
            cluster.kill(rng.choice(alive))
        elif roll < 0.91 and len(alive) < 4:
            cluster.join()
        elif roll < 0.94 and alive:  # a channel that takes nothing for a while (a full socket)
            worker = rng.choice(alive)
            if worker in cluster.stuck:
                cluster.release(worker)
            else:
                cluster.stuck[worker] = []
        else:
            cluster.tick(rng.randint(1, 400))
    return cluster


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 300))
def test_random_schedules_keep_the_fence_and_order(seed: int, steps: int) -> None:
    cluster = run_schedule(seed, steps)
    cluster.settle()
    # Liveness once everything is delivered: every live worker is at the head, the fence
    # too (the dead never held it back), every event was published, every write answered.
    primary = cluster.primary
    assert primary.fence == primary.seq
    for worker, node in cluster.nodes.items():
        assert node.state == primary.seq and primary.applied(worker) == primary.seq
        assert node.replica.held == (0, 0)
        assert set(node.replies) == set(node.expected)
        assert node.published == sorted(node.published)


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 300))
def test_lost_messages_are_noticed_and_repaired_by_a_state(seed: int, steps: int) -> None:
    cluster = run_schedule(seed, steps, lossy=True)
    cluster.settle()
    for _ in range(3):  # new commands reach every survivor; a survivor with a gap resyncs
        cluster.append()
        cluster.settle()
    cluster.tick(cluster.primary.ack_timeout_ms + 1)  # a worker whose state was lost is dropped
    cluster.settle()
    primary = cluster.primary
    assert primary.fence == primary.seq
    for node in cluster.nodes.values():
        assert node.state == primary.seq


# --- single behaviours, by hand ------------------------------------------------------------


def test_the_fence_waits_for_the_slowest_channel_not_for_any_worker() -> None:
    cluster = Cluster(random.Random(1), window=10, tail=10)
    a, b = cluster.join(), cluster.join()
    cluster.settle()
    cluster.stuck[b] = []  # b's socket takes nothing for now
    seq = cluster.append()
    while cluster.nodes[a].inbox:
        cluster.to_worker(a)  # a applies it and holds its event
    cluster.to_primary(a)
    assert cluster.primary.fence == seq - 1 and cluster.nodes[a].published == []
    assert cluster.nodes[a].replica.held == (1, len(b"e%d" % seq))
    cluster.release(b)  # in b's socket: the fence passes it though b has read nothing
    assert cluster.primary.fence == seq and cluster.nodes[b].state == seq - 1
    cluster.to_worker(a)  # the Fence
    assert cluster.nodes[a].published == [seq]
    cluster.read(b)  # a read at b takes in its channel first: it answers at seq
    assert cluster.nodes[b].state == seq
    cluster.settle()
    assert cluster.nodes[b].published == [seq]


def test_a_dead_worker_leaves_the_fence_at_once() -> None:
    cluster = Cluster(random.Random(2), window=10, tail=10)
    a, b = cluster.join(), cluster.join()
    cluster.settle()
    cluster.stuck[b] = []
    seq = cluster.append()
    while cluster.nodes[a].inbox:
        cluster.to_worker(a)
    assert cluster.primary.fence == seq - 1 and cluster.nodes[a].published == []
    cluster.kill(b)
    assert cluster.primary.fence == seq
    cluster.settle()
    assert cluster.nodes[a].published == [seq]


def test_a_silent_worker_is_dropped_after_the_ack_timeout_and_not_before() -> None:
    cluster = Cluster(random.Random(3), window=10, tail=10, ack_timeout_ms=1000)
    a, b = cluster.join(), cluster.join()
    cluster.settle()
    cluster.append()
    cluster.to_worker(a)
    cluster.to_primary(a)  # b never reads
    assert cluster.primary.next_deadline() == 1001
    cluster.tick(1000)
    assert b in cluster.primary.workers
    cluster.tick(1)
    assert cluster.primary.workers == [a] and cluster.primary.fence == cluster.primary.seq
    assert cluster.primary.dropped == 1 and cluster.primary.next_deadline() is None


def test_an_idle_primary_wants_no_timer() -> None:
    cluster = Cluster(random.Random(4))
    cluster.join()
    cluster.settle()
    assert cluster.primary.next_deadline() is None
    cluster.append()
    cluster.settle()
    assert cluster.primary.next_deadline() is None


def test_a_worker_past_the_tail_gets_a_state_instead() -> None:
    cluster = Cluster(random.Random(5), window=2, tail=3, shipped=0)  # commands only
    a, b = cluster.join(), cluster.join()
    cluster.settle()
    transfers = cluster.primary.transfers
    for _ in range(10):
        cluster.append()
        while cluster.nodes[a].inbox:
            cluster.to_worker(a)
        cluster.to_primary(a)
    # b read nothing: 2 commands sent (its window), the rest held until the tail bound...
    assert sum(isinstance(decode_to_worker(m), Apply) for m in cluster.nodes[b].inbox) == 2
    assert cluster.primary.tail == (3, sum(len(b"c%d" % s) for s in (8, 9, 10)))
    cluster.settle()
    # ... and when b caught up with its window, the command it needed next was gone.
    assert cluster.primary.transfers == transfers + 1
    assert cluster.nodes[b].state == 10 and cluster.primary.fence == 10


def test_a_gap_makes_the_replica_ask_for_a_state_and_ignore_commands_until_then() -> None:
    replica = Replica()
    replica.on_message(State(5, b"s5"))
    replica.on_message(Apply(6, b"c6"))
    replica.on_message(Apply(8, b"c8"))  # 7 is missing
    replica.on_message(Apply(9, b"c9"))
    assert replica.actions() == [LoadState(5, b"s5"), ApplyCommand(6, b"c6"),
                                 SendToPrimary(Resync(6))]
    replica.on_message(State(9, b"s9"))
    replica.on_message(Apply(10, b"c10"))
    assert replica.actions() == [LoadState(9, b"s9"), ApplyCommand(10, b"c10"),
                                 SendToPrimary(Ack(10))]
    assert replica.resyncs == 1


def test_a_duplicate_command_makes_the_replica_ask_for_a_state() -> None:
    replica = Replica()
    replica.on_message(State(1, b"s1"))
    replica.on_message(Apply(2, b"c2"))
    replica.actions()
    replica.on_message(Apply(2, b"c2"))
    assert replica.actions() == [SendToPrimary(Resync(2))]


def test_a_replica_applies_nothing_before_its_first_state() -> None:
    replica = Replica()
    replica.on_message(Apply(1, b"c1"))
    replica.on_message(Fence(1))
    assert replica.actions() == [] and not replica.loaded


def test_a_forwarded_reply_waits_for_its_seq() -> None:
    replica = Replica()
    replica.on_message(State(3, b"s3"))
    token = replica.forward(b"write")
    assert replica.actions() == [LoadState(3, b"s3"), SendToPrimary(Forward(token, b"write")),
                                 SendToPrimary(Ack(3))]
    replica.on_message(Answer(token, 5, b"ok"))
    replica.on_message(Apply(4, b"c4"))
    assert replica.actions() == [ApplyCommand(4, b"c4"), SendToPrimary(Ack(4))]
    replica.on_message(Apply(5, b"c5"))
    assert replica.actions() == [ApplyCommand(5, b"c5"), Reply(token, b"ok"),
                                 SendToPrimary(Ack(5))]


def test_shipped_events_go_before_the_commands_are_applied_and_the_ack_after() -> None:
    # A lone worker (each Apply's fence is its seq): the events the primary shipped are
    # published before its commands are applied (the worker applies them in the same turn,
    # before it serves anything else), and the batch acknowledged once they are.
    replica = Replica()
    replica.on_message(State(0, b"s0"))
    replica.actions()
    replica.on_message(Apply(1, b"c1", 1, [b"route/T", b"r1"]))
    replica.on_message(Apply(2, b"c2", 2, []))  # a command that made no event
    assert replica.actions() == [Publish(1, [b"route/T", b"r1"]),
                                 ApplyCommand(1, b"c1", produce=False),
                                 ApplyCommand(2, b"c2", produce=False), SendToPrimary(Ack(2))]
    # Behind another worker (fence 2): held, published as the Fence passes them.
    replica.on_message(Apply(3, b"c3", 2, [b"route/T", b"r3"]))
    assert replica.actions() == [ApplyCommand(3, b"c3", produce=False), SendToPrimary(Ack(3))]
    assert replica.held == (1, len(b"route/Tr3"))
    replica.on_message(Fence(3))
    assert replica.actions() == [Publish(3, [b"route/T", b"r3"])]


def test_events_wait_for_the_command_before_them_whose_replica_makes_its_own() -> None:
    replica = Replica()
    replica.on_message(State(0, b"s0"))
    replica.actions()
    replica.on_message(Apply(1, b"c1", 1, None))  # too large to ship: made by the replica
    replica.on_message(Apply(2, b"c2", 2, [b"e2"]))
    assert replica.actions() == [ApplyCommand(1, b"c1"), ApplyCommand(2, b"c2", produce=False),
                                 SendToPrimary(Ack(2))]
    replica.produced(1, [b"e1"])  # as the driver does once it applied command 1
    assert replica.actions() == [Publish(1, [b"e1"]), Publish(2, [b"e2"])]
    assert replica.held == (0, 0)


def test_the_primary_ships_a_commands_events_in_its_apply_and_counts_them_in_the_tail() -> None:
    primary = Primary(now=0)
    worker = primary.join(0)
    primary.actions()  # its state is not dumped yet: its commands wait in the tail
    primary.append(b"c1", 0, [b"route/T", b"r1"])
    primary.append(b"c2", 0, None)
    assert primary.tail == (2, len(b"c1route/Tr1c2"))
    primary.dumped(worker, 0, b"s0")
    assert deliveries(primary.actions()) == [State(0, b"s0", 0, 2, 1),
                                             Apply(1, b"c1", 1, [b"route/T", b"r1"]),
                                             Apply(2, b"c2", 2, None)]
    assert decode_to_worker(encode(Apply(1, b"c1", 1, [b"route/T", b"r1"]))) == \
        Apply(1, b"c1", 1, [b"route/T", b"r1"])


def test_events_are_shipped_up_to_a_size() -> None:
    read: list[int] = []

    def frames(count: int) -> Iterator[tuple[bytes, bytes]]:
        for i in range(count):
            read.append(i)
            yield b"route/T", b"x" * 93  # 100 bytes a frame
    assert shipped_events(frames(3), limit=300) == [b"route/T", b"x" * 93] * 3
    assert shipped_events([], limit=300) == []
    read.clear()
    assert shipped_events(frames(10), limit=300) is None
    assert read == [0, 1, 2, 3], "no frame is read (encoded) past the limit"


def test_acks_are_one_per_batch() -> None:
    replica = Replica()
    replica.on_message(State(0, b"s0"))
    for seq in range(1, 101):
        replica.on_message(Apply(seq, b"c"))
    acks = [a for a in replica.actions() if isinstance(a, SendToPrimary)]
    assert acks == [SendToPrimary(Ack(100))]
    assert replica.actions() == []


def test_held_events_are_bounded_and_the_oldest_dropped() -> None:
    replica = Replica(max_held_bytes=10)
    replica.on_message(State(0, b"s0"))
    for seq in range(1, 5):
        replica.on_message(Apply(seq, b"c"))
        replica.produced(seq, [b"ch", b"ee"])  # one event: its channel and body frames
    assert replica.held == (2, 8) and replica.dropped_events == 2
    replica.on_message(Fence(4))
    assert [a for a in replica.actions() if isinstance(a, Publish)] == [
        Publish(3, [b"ch", b"ee"]), Publish(4, [b"ch", b"ee"])]


def test_an_ack_outside_what_was_sent_drops_the_worker() -> None:
    primary = Primary(now=0)
    worker = primary.join(0)
    primary.actions()
    primary.on_message(worker, Ack(1), 0)  # nothing past 0 was ever sent
    assert primary.actions() == [Drop(worker, "acknowledged seq 1 outside 0..0")]
    assert primary.workers == [] and primary.fence == primary.seq


def test_the_lag_is_measured_from_append_to_commit() -> None:
    primary = Primary(now=0)
    worker = primary.join(0)
    primary.append(b"c1", 10)
    primary.append(b"c2", 12)
    primary.actions()
    primary.on_message(worker, Ack(2), 15)
    primary.actions()
    assert primary.take_lags() == [5, 3] and primary.take_lags() == []


def test_a_join_counts_at_the_current_seq_and_the_fence_never_moves_back() -> None:
    primary = Primary(now=0)
    a = primary.join(0)
    for seq in range(1, 4):
        primary.append(b"c%d" % seq, 0)
    primary.on_message(a, Ack(3), 0)
    assert primary.fence == 3
    b = primary.join(0)
    assert primary.fence == 3
    assert SendState(b, 3) in primary.actions()


def send_states(primary: Primary) -> list[PrimaryAction]:
    """Carry out the states asked for (each a small dump, sent whole in one part); the
    other actions."""
    rest = []
    for action in primary.actions():
        if isinstance(action, SendState):
            primary.dumped(action.worker, action.seq, b"s%d" % action.seq)
        else:
            rest.append(action)
    return rest


def test_messages_are_strictly_typed() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_to_primary(encode(Apply(1, b"x")))
    with pytest.raises(msgspec.DecodeError):
        decode_to_worker(b"\x00garbage")
    assert decode_to_worker(encode(Fence(7))) == Fence(7)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Primary(now=0, window=0)


def test_a_state_sent_to_a_silent_worker_does_not_extend_its_ack_timeout() -> None:
    primary = Primary(now=0, window=2, max_tail_commands=2, ack_timeout_ms=1000)
    a, b = primary.join(0), primary.join(0)
    send_states(primary)
    primary.append(b"c1", 0)  # b is sent c1 at 0 and never acknowledges anything
    for seq in range(2, 10):  # a keeps up; b's next command leaves the tail
        primary.append(b"c%d" % seq, 900)
        primary.on_message(a, Ack(seq), 900)
    primary.on_message(b, Resync(0), 900)  # b asks for a state: sent at 900
    assert any(isinstance(x, SendState) and x.worker == b for x in primary.actions())
    assert primary.next_deadline() == 1001
    primary.on_timer(1001)
    assert primary.workers == [a]


def test_the_tail_is_held_to_its_byte_bound() -> None:
    primary = Primary(now=0, window=1, max_tail_commands=1000, max_tail_bytes=1000)
    primary.join(0)  # never acknowledges: everything past its window stays in the tail
    for _ in range(50):
        primary.append(b"x" * 100, 0)
        assert primary.tail[1] <= 1000
    assert primary.tail == (10, 1000)


def test_lag_samples_are_bounded() -> None:
    primary = Primary(now=0, window=2 * MAX_LAG_SAMPLES + 10, max_tail_commands=1)
    worker = primary.join(0)
    for _ in range(10):  # the oldest: their append times are forgotten past the bound
        primary.append(b"c", 0)
    for _ in range(MAX_LAG_SAMPLES):
        primary.append(b"c", 1)
    primary.on_message(worker, Ack(primary.seq), 5)
    primary.actions()
    for _ in range(MAX_LAG_SAMPLES):  # a second batch, not taken in between
        primary.append(b"c", 5)
    primary.on_message(worker, Ack(primary.seq), 6)
    primary.actions()
    lags = primary.take_lags()
    assert len(lags) == MAX_LAG_SAMPLES and set(lags) == {4}


def test_a_lone_worker_publishes_as_it_applies_and_waits_again_once_another_joins() -> None:
    cluster = Cluster(random.Random(7), window=10, tail=10)
    a = cluster.join()
    cluster.settle()
    seq = cluster.append()
    assert [type(decode_to_worker(m)) for m in cluster.nodes[a].inbox] == [Apply], \
        "its Apply says what a Fence would"
    cluster.to_worker(a)
    assert cluster.nodes[a].published == [seq]
    cluster.settle()
    b = cluster.join()  # b counts at once, at the current seq
    cluster.settle()
    cluster.stuck[b] = []
    seq = cluster.append()
    while cluster.nodes[a].inbox:
        cluster.to_worker(a)
    assert seq not in cluster.nodes[a].published, "not written to b yet: a must wait"
    cluster.release(b)
    cluster.settle()
    assert cluster.nodes[a].published[-1] == seq and cluster.nodes[b].published == [seq]
    cluster.kill(b)  # alone again: the next command carries its own seq as the fence
    seq = cluster.append()
    cluster.to_worker(a)
    assert cluster.nodes[a].published[-1] == seq


# --- a state transfer in parts ----------------------------------------------------------------


def deliveries(actions: list[PrimaryAction]) -> list[object]:
    return [a.message for a in actions if isinstance(a, Deliver)]


def test_a_state_is_sent_in_parts_within_its_window_and_the_commands_of_meanwhile_after_it(
        ) -> None:
    primary = Primary(now=0, chunk_bytes=3, transfer_window_bytes=6)
    worker = primary.join(0)
    assert primary.actions() == [SendState(worker, 0)]
    primary.append(b"c1", 1)  # comes while the state is being dumped and sent: it waits
    primary.dumped(worker, 0, b"0123456789")
    assert deliveries(primary.actions()) == [State(0, b"012", 0, 10, 1),
                                             State(0, b"345", 3, 10, 1)]
    assert primary.transfer_bytes == 10  # the dump is held until its last part is out
    primary.on_message(worker, Received(1, 3), 2)
    assert deliveries(primary.actions()) == [State(0, b"678", 6, 10, 1)]
    primary.on_message(worker, Received(1, 3), 2)  # nothing new: nothing more
    assert deliveries(primary.actions()) == []
    primary.on_message(worker, Received(1, 6), 3)
    assert deliveries(primary.actions()) == [State(0, b"9", 9, 10, 1), Apply(1, b"c1", 1)]
    assert primary.transfer_bytes == 0

    replica = Replica()
    for part in (State(0, b"012", 0, 10, 1), State(0, b"345", 3, 10, 1),
                 State(0, b"678", 6, 10, 1)):
        replica.on_message(part)
    assert replica.actions() == [SendToPrimary(Received(1, 9))]  # one per batch
    assert not replica.loaded
    replica.on_message(State(0, b"9", 9, 10, 1))
    replica.on_message(Apply(1, b"c1"))
    assert replica.actions() == [LoadState(0, b"0123456789"), ApplyCommand(1, b"c1"),
                                 SendToPrimary(Received(1, 10)), SendToPrimary(Ack(1))]


def test_a_transfer_replaced_by_another_stops_and_the_replica_starts_again() -> None:
    primary = Primary(now=0, chunk_bytes=2, transfer_window_bytes=2)
    worker = primary.join(0)
    primary.actions()
    primary.dumped(worker, 0, b"aaaa")
    assert deliveries(primary.actions()) == [State(0, b"aa", 0, 4, 1)]
    primary.append(b"c1", 1)
    primary.on_message(worker, Resync(0), 1)  # a new transfer, at seq 1
    assert primary.actions() == [SendState(worker, 1)]
    primary.on_message(worker, Received(1, 2), 2)  # of the old one: ignored
    assert primary.actions() == []
    primary.dumped(worker, 0, b"stale")  # a dump for the old one: ignored
    primary.dumped(worker, 1, b"bb")
    assert deliveries(primary.actions()) == [State(1, b"bb", 0, 2, 2)]

    replica = Replica()
    for part in (State(0, b"aa", 0, 4, 1), State(1, b"bb", 0, 2, 2)):
        replica.on_message(part)
    assert [a for a in replica.actions() if isinstance(a, LoadState)] == [LoadState(1, b"bb")]


def test_a_part_that_does_not_follow_ends_the_assembly_and_asks_for_a_state_once() -> None:
    replica = Replica()
    replica.on_message(State(3, b"s3"))  # loaded whole
    replica.actions()
    replica.on_message(State(5, b"ab", 0, 6, 7))
    replica.on_message(State(5, b"ef", 4, 6, 7))  # the part at 2 is missing
    replica.on_message(State(5, b"gh", 6, 6, 7))  # the rest of the given-up assembly
    assert replica.actions() == [SendToPrimary(Resync(3))]  # nothing of the given-up one
    assert replica.awaiting_state and replica.applied == 3


def sending_a_state(now: int = 0, **bounds: int) -> tuple[Primary, int]:
    """A primary sending a new worker the 6-byte state b"abcdef" in parts of 2 bytes, one at
    a time (its first part handed out already); the primary and the worker."""
    primary = Primary(now=now, chunk_bytes=2, transfer_window_bytes=2, **bounds)
    worker = primary.join(now)
    primary.actions()
    primary.dumped(worker, 0, b"abcdef")
    primary.actions()
    return primary, worker


def test_a_worker_that_acknowledges_no_part_is_dropped_and_its_dump_let_go() -> None:
    primary, worker = sending_a_state(ack_timeout_ms=1000)
    assert primary.transfer_bytes == 6 and primary.next_deadline() == 1001
    primary.on_timer(1001)
    assert primary.actions() == [Drop(worker, "no acknowledgement for 1001 ms")]
    assert primary.transfer_bytes == 0 and primary.workers == []


def test_an_acknowledgement_of_more_than_was_handed_out_is_ignored() -> None:
    primary, worker = sending_a_state()
    primary.on_message(worker, Received(1, 4), 1)  # more than it was sent
    assert primary.actions() == [] and primary.workers == [worker]
    primary.on_message(worker, Received(1, 2), 1)
    assert deliveries(primary.actions()) == [State(0, b"cd", 2, 6, 1)]


# --- what mutation testing found unpinned -----------------------------------------------------


@pytest.mark.parametrize("bound", ["window", "max_tail_commands", "max_tail_bytes",
                                   "ack_timeout_ms", "chunk_bytes", "transfer_window_bytes"])
def test_each_bound_of_the_primary_must_be_positive(bound: str) -> None:
    with pytest.raises(ValueError):
        Primary(now=0, **{bound: 0})


def test_every_worker_dropped_is_counted() -> None:
    primary = Primary(now=0, ack_timeout_ms=1000)
    primary.join(0), primary.join(0)
    send_states(primary)
    primary.append(b"c1", 0)  # neither acknowledges it
    primary.actions()
    primary.on_timer(1001)
    assert [type(a) for a in primary.actions()] == [Drop, Drop]
    assert primary.dropped == 2 and primary.workers == []


def test_a_worker_whose_next_command_just_left_the_tail_gets_a_state() -> None:
    primary = Primary(now=0, window=1, max_tail_commands=2)
    a, b = primary.join(0), primary.join(0)
    send_states(primary)
    primary.actions()
    primary.append(b"c1", 0)  # both are sent c1; b never acknowledges it (its window is full)
    for seq in (2, 3, 4):
        primary.on_message(a, Ack(seq - 1), 0)
        primary.append(b"c%d" % seq, 0)
    assert primary.tail == (2, len(b"c3c4"))  # c2, b's next, is one before the tail
    primary.actions()
    primary.on_message(b, Ack(1), 0)
    assert [a for a in primary.actions() if not isinstance(a, Deliver)] == [SendState(b, 4)]


def test_a_worker_behind_a_tail_holding_nothing_gets_a_state() -> None:
    primary = Primary(now=0, window=1, max_tail_bytes=1)  # no command fits in the tail
    worker = primary.join(0)
    send_states(primary)
    primary.actions()
    primary.append(b"c1", 0)
    primary.append(b"c2", 0)  # past the window: dropped from the tail at once
    assert primary.tail == (0, 0)
    assert deliveries(primary.actions()) == [Apply(1, b"c1", 1)]
    primary.on_message(worker, Ack(1), 0)
    assert [a for a in primary.actions() if not isinstance(a, Deliver)] == [SendState(worker, 2)]


def test_an_empty_dump_is_sent_as_one_empty_part_and_the_commands_follow_it() -> None:
    # A forked worker's first state: it holds the fork's copy, so its dump is empty.
    primary = Primary(now=0)
    worker = primary.join(0)
    assert primary.actions() == [SendState(worker, 0)]
    primary.append(b"c1", 0)
    primary.dumped(worker, 0, b"")
    actions = primary.actions()
    assert actions == [Deliver(worker, State(0, b"", 0, 0, 1)),
                       Deliver(worker, Apply(1, b"c1", 1))]
    sent = deliveries(actions)
    replica = Replica()
    for message in sent:
        replica.on_message(decode_to_worker(encode(message)))
    actions = replica.actions()
    assert LoadState(0, b"") in actions and ApplyCommand(1, b"c1") in actions
    assert replica.loaded and replica.applied == 1


def test_the_tail_holds_only_what_some_worker_was_not_sent() -> None:
    primary = Primary(now=0)
    primary.join(0)
    send_states(primary)
    for seq in range(1, 4):
        primary.append(b"c%d" % seq, 0)
    assert primary.tail == (0, 0)


def test_a_dump_for_a_worker_gone_or_already_sent_its_state_is_ignored() -> None:
    primary = Primary(now=0)
    gone = primary.join(0)
    primary.actions()
    primary.leave(gone)
    primary.dumped(gone, 0, b"s0")  # it left while its dump was being made
    assert primary.actions() == []
    worker = primary.join(0)
    primary.actions()
    primary.dumped(worker, 0, b"s0")
    assert deliveries(primary.actions()) == [State(0, b"s0", 0, 2, 2)]
    primary.dumped(worker, 0, b"s0")  # handed over twice: sent once
    assert primary.actions() == []


def test_a_worker_that_joins_later_acknowledges_the_seq_of_its_state_and_stays() -> None:
    cluster = Cluster(random.Random(8), window=10, tail=10)
    cluster.join()
    cluster.settle()
    for _ in range(3):
        cluster.append()
    cluster.settle()
    late = cluster.join()  # at seq 3: its replica acknowledges 3 once loaded
    cluster.settle()
    assert late in cluster.primary.workers and cluster.primary.dropped == 0
    assert cluster.primary.applied(late) == 3


def test_a_silent_worker_in_a_transfer_is_dropped_its_timeout_after_its_last_new_part() -> None:
    primary, worker = sending_a_state(5000, ack_timeout_ms=1000)
    primary.on_message(worker, Received(1, 2), 5500)  # the first part: its clock restarts
    assert deliveries(primary.actions()) == [State(0, b"cd", 2, 6, 1)]
    assert primary.next_deadline() == 6501
    primary.on_message(worker, Received(1, 2), 6000)  # nothing new: the clock runs on
    assert primary.next_deadline() == 6501
    primary.on_timer(6500)
    assert primary.workers == [worker]
    primary.on_timer(6501)
    assert primary.actions() == [Drop(worker, "no acknowledgement for 1001 ms")]


def test_leave_of_a_worker_already_dropped_changes_nothing() -> None:
    # The link may see a dropped worker's channel fail (sending what was queued for it
    # before its Drop) and report it gone.
    primary = Primary(now=0)
    worker, other = primary.join(0), primary.join(0)
    send_states(primary)
    primary.on_message(worker, Ack(5), 0)  # outside what it was sent: dropped
    primary.leave(worker)
    assert primary.workers == [other] and primary.dropped == 1


def test_every_resync_is_counted() -> None:
    replica = Replica()
    replica.on_message(State(1, b"s1"))
    replica.on_message(Apply(3, b"c3"))  # a gap
    replica.on_message(State(3, b"s3"))
    replica.on_message(Apply(3, b"c3"))  # a duplicate
    assert replica.resyncs == 2


def test_a_part_past_its_total_or_over_the_part_before_is_refused() -> None:
    for parts in ([State(5, b"abcdef", 0, 4, 7)],  # past its total
                  [State(5, b"ab", 0, 4, 7), State(5, b"cd", 1, 4, 7)]):  # overlapping
        replica = Replica()
        replica.on_message(State(3, b"s3"))
        replica.actions()
        for part in parts:
            replica.on_message(part)
        assert replica.actions() == [SendToPrimary(Resync(3))]
        assert not any(isinstance(a, LoadState) for a in replica.actions())


def test_held_events_up_to_the_bound_exactly_are_kept() -> None:
    replica = Replica(max_held_bytes=8)
    replica.on_message(State(0, b"s0"))
    for seq in (1, 2):
        replica.on_message(Apply(seq, b"c"))
        replica.produced(seq, [b"ch", b"ee"])
    assert replica.held == (2, 8) and replica.dropped_events == 0


def test_events_of_a_command_whose_place_was_dropped_are_counted_as_they_are_produced() -> None:
    replica = Replica(max_held_bytes=4)
    replica.on_message(State(0, b"s0"))
    replica.on_message(Apply(1, b"c1", 0, None))  # its events to be made by the replica
    replica.on_message(Apply(2, b"c2", 0, [b"ch", b"eee"]))  # past the bound: 1's place, 2
    assert replica.held == (0, 0) and replica.dropped_events == 1
    replica.produced(1, [b"c", b"e1", b"c", b"e1"])  # two events
    assert replica.dropped_events == 3 and replica.held == (0, 0)


def test_the_primary_knows_no_applied_seq_for_a_worker_it_dropped_or_never_had() -> None:
    # `zns status` asks it of every channel it still has a process for: a dropped worker's
    # process may not be reaped yet.
    primary = Primary(now=0)
    worker = primary.join(0)
    send_states(primary)
    assert primary.applied(worker) == 0
    primary.on_message(worker, Ack(5), 0)  # outside what it was sent: dropped
    assert primary.applied(worker) is None and primary.applied(worker + 1) is None


def test_a_replica_waiting_for_a_state_still_takes_the_fence_an_ignored_command_carries() -> None:
    # The primary sends a worker no Fence of what it was told in an Apply (`told`), so
    # an Apply the replica ignores (it waits for a state after a gap or a duplicate) must
    # not lose the fence it carries: it held for that Apply's channel, which the replica
    # read. Before, the events the replica held for that fence stayed held until some
    # later command happened to carry a higher one (none, while nothing is written).
    primary = Primary(now=0)
    a, b = primary.join(0), primary.join(0)
    for action in primary.actions():
        assert isinstance(action, SendState)
        primary.dumped(action.worker, 0, b"s0")
    replicas = {a: Replica(), b: Replica()}
    channels: dict[int, list[object]] = {a: [], b: []}

    def carry_out() -> None:
        for action in primary.actions():
            assert isinstance(action, Deliver)
            channels[action.worker].append(action.message)

    carry_out()
    for worker in (a, b):  # the states, written and loaded
        for message in channels[worker]:
            replicas[worker].on_message(message)
        channels[worker].clear()
        replicas[worker].actions()
    primary.append(b"c1", 0, [b"ch", b"e1"])
    carry_out()
    primary.written(b, 1)  # b's channel took Apply 1; a's is full for now
    carry_out()
    primary.append(b"c2", 0, [])
    carry_out()
    first, second = channels[a]
    assert first == Apply(1, b"c1", 0, [b"ch", b"e1"]) and second == Apply(2, b"c2", 1, [])
    replica = replicas[a]
    replica.on_message(first)  # a holds e1 for the fence ...
    assert not [x for x in replica.actions() if isinstance(x, Publish)]
    replica.on_message(first)  # ... sees a duplicate (a channel's bug) and waits for a state
    assert replica.awaiting_state
    replica.on_message(second)  # ignored, but written to a: the fence is 1 now
    primary.written(a, 2)
    assert primary.fence == 1
    carry_out()
    assert not any(isinstance(m, Fence) for m in channels[a]), "told by Apply 2 already"
    assert Publish(1, [b"ch", b"e1"]) in replica.actions()


@pytest.mark.timeout(60)
def test_what_held_events_take_in_memory_is_about_twice_their_bytes_at_most() -> None:
    # docs/operations.md: events held for the fence are bounded at their bytes (64 MiB);
    # small ones take about twice that in memory (each held command is a tuple, a list and
    # a bytes object per frame). A fence that never moves, and ten times the bound sent.
    import os
    import tracemalloc

    bound = 2 * 1024 * 1024
    replica = Replica(max_held_bytes=bound)
    replica.on_message(State(0, b"s0"))
    replica.actions()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(1, 100_001):  # 212 bytes of events each: a small route event
            replica.on_message(Apply(seq, b"", 0, [b"route/T%05d" % (seq % 100_000),
                                                   os.urandom(200)]))
            replica.actions()
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    commands, held = replica.held
    # Each command made one event (two frames): the metric counts events, not frames.
    assert held <= bound and replica.dropped_events == 100_000 - commands
    assert taken <= 2.5 * bound, taken
