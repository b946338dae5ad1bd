"""Fixtures for the interop tests: real RocketMQ 5.3.3 JVMs, started and always killed.

`rocketmq_env` skips every interop test with the reason ("no JDK/Maven: ...") when the
JDK side is missing; with ZNS_REQUIRE_INTEROP=1 (CI sets it) that is a failure instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rocketmq


@pytest.fixture(scope="session")
def rocketmq_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The jars are cached and ZnsInteropClient is compiled; at session end no JVM is left."""
    rocketmq.set_scratch_dir(tmp_path_factory.mktemp("rmq-oneshot"))
    try:
        rocketmq.ensure_jars()
        rocketmq.client_classes()
    except rocketmq.InteropUnavailable as exc:
        if rocketmq.interop_required():
            pytest.fail(f"{exc} ({rocketmq.REQUIRE_ENV}=1 makes this a failure)", pytrace=False)
        pytest.skip(str(exc))
    yield
    rocketmq.kill_all()


@pytest.fixture(scope="module")
def rmq_module(rocketmq_env: None, tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[rocketmq.ProcessGroup]:
    """A process group shared by one test module (NameServers and brokers that outlive a test)."""
    group = rocketmq.ProcessGroup(tmp_path_factory.mktemp(f"rmq-{request.module.__name__}"))
    yield group
    group.close()


@pytest.fixture
def rmq(rocketmq_env: None, tmp_path) -> Iterator[rocketmq.ProcessGroup]:
    """A process group for one test; everything in it is killed when the test ends."""
    group = rocketmq.ProcessGroup(tmp_path / "rmq")
    yield group
    group.close()
