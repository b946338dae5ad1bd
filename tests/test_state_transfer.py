"""A state transfer's dump made in steps (StateMachine.dump_in_steps), without sockets."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from zns.core import state, state_dump
from zns.drivers.kv_file import KvStore
from zns.core.schema import DataVersion, RegisterBroker, TopicConfig
from zns.core.state import StateMachine, Write

pytestmark = pytest.mark.timeout(30)


def register(name: str, topics: int, now: int = 1000, first: int = 0) -> Write:
    return Write(request=RegisterBroker(
        id=1, cluster="c", broker_name=name, broker_id=0, broker_addr=f"{name}:10911",
        topics={f"T{i}": TopicConfig(8, 8, 6, 0) for i in range(first, first + topics)},
        data_version=DataVersion(1, 2, 3)), now=now, connection=None)


@pytest.fixture
def machine() -> StateMachine:
    machine = StateMachine(KvStore(None), epoch="e")
    machine.apply(register("a", 5_000))  # 5,000 queue entries: three steps of 2,000
    return machine


def test_a_dump_in_steps_is_the_dump_when_nothing_changes(machine: StateMachine) -> None:
    steps = list(machine.dump_in_steps())
    # Three steps of 2,000, 2,000 and 1,000 queue entries and topics' revisions.
    assert steps[:-1] == [None, None] and steps[-1] == machine.dump()


def test_no_step_of_a_dump_encodes_more_than_its_share(
        machine: StateMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step that makes the dump places the long lists already encoded (the queue data,
    the topics, their revisions): it encodes none of them item by item."""
    extended: list[int] = []
    original = state_dump.EncodedList.extend

    def extend(self: state_dump.EncodedList, items: list[Any]) -> None:
        extended.append(len(items))
        original(self, items)

    encoded: list[Any] = []
    real_encode = msgspec.msgpack.encode

    def encode(value: Any) -> bytes:
        encoded.append(value)
        return real_encode(value)

    monkeypatch.setattr(state_dump.EncodedList, "extend", extend)
    steps = machine.dump_in_steps()
    with monkeypatch.context() as patched:
        patched.setattr(state.msgspec.msgpack, "encode", encode)
        *_, dump = steps
    assert dump == machine.dump()
    assert max(extended) <= 2_000 and sum(extended) > 10_000  # values, topics, revisions
    (whole,) = encoded
    assert type(whole.table.state.topics) is msgspec.Raw
    assert type(whole.table.state.queue_values) is msgspec.Raw
    assert type(whole.table.topic_revisions) is msgspec.Raw


@pytest.mark.parametrize("length", [0, 1, 15, 16, 255, 65_535, 65_536, 70_000])
def test_an_encoded_list_is_the_list_as_msgspec_encodes_it(length: int) -> None:
    items = [(f"T{i}", [i, i + 1]) for i in range(length)]
    pieces = state_dump.EncodedList()
    for start in range(0, length, 7_000):
        pieces.extend(items[start:start + 7_000])
    assert msgspec.msgpack.encode(pieces.raw()) == msgspec.msgpack.encode(items)


def test_a_change_between_steps_starts_them_over_and_the_dump_is_as_of_the_last_step(
        machine: StateMachine) -> None:
    steps = machine.dump_in_steps()
    assert next(steps) is None
    machine.apply(register("b", 10, first=9_000))  # the queue data the steps read changed
    rest = list(steps)
    # Started over: two steps more (carried on, it would have taken one).
    assert rest[:-1] == [None, None] and rest[-1] == machine.dump()
    # A change that leaves what the steps read alone (a heartbeat's time) is in the dump.
    steps = machine.dump_in_steps()
    assert next(steps) is None
    machine.apply(register("a", 5_000, now=2000))  # the same registration, later
    assert list(steps)[-1] == machine.dump()


def test_a_stream_of_changes_cannot_keep_a_dump_from_ending(machine: StateMachine) -> None:
    steps = machine.dump_in_steps(max_restarts=2)
    made = 0
    for n, step in enumerate(steps):
        if step is not None:
            break
        made += 1
        machine.apply(register(f"x{n}", 1, first=20_000 + n))  # a change after every step
    assert made == 3  # one step of each of the three tries, then the whole in one step
    assert step == machine.dump()


def test_topics_held_by_several_brokers_dump_in_steps_as_in_one() -> None:
    # Two queue entries a topic: the queue data take more steps than the topics' revisions,
    # whose steps run out first.
    machine = StateMachine(KvStore(None), epoch="e")
    machine.apply(register("a", 5))
    machine.apply(register("b", 5))
    steps = list(machine.dump_in_steps(work=2))
    assert steps.count(None) == 5 and steps[-1] == machine.dump()
