"""A state transfer's dump made in steps (StateMachine.dump_in_steps), without sockets."""

from __future__ import annotations

import pytest

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
    assert steps[:-1] == [None, None] and steps[-1] == machine.dump()


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
