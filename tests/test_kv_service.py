"""KV writes through NameService: a write that cannot be made durable is `internal` and
changes nothing — not the store, not the routes, no event; `--max-kv-bytes` bounds the store."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import helpers
from helpers import register_fields, zns1_events, zns1_ok_events
from zns.core import schema
from zns.core.limits import Limits
from zns.core.schema import ORDER_TOPIC_CONFIG
from zns.core.service import NameService
from zns.drivers.kv_file import KvStore, read_kv_file




@pytest.fixture
def service(tmp_path: Path):
    kv = KvStore(tmp_path / "kv.json")
    svc = NameService(kv, epoch="e" * 16, started_at_ms=0)
    zns1_ok_events(svc, "register_broker", **register_fields(topics={"T": {"order": True}}))
    zns1_ok_events(svc, "kv_put", namespace=ORDER_TOPIC_CONFIG, key="T", value="broker-a:4")
    zns1_ok_events(svc, "kv_put", namespace="ns", key="k", value="v")
    yield svc
    kv.close()


def failing_fsync(monkeypatch: pytest.MonkeyPatch, kv_path: Path) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(kv_path)):
            raise OSError(errno.EIO, "injected fsync failure")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def observable(svc: NameService) -> tuple:
    return (svc.table.revision, svc.table.topic_revision("T"),
            helpers.observable(svc, (ORDER_TOPIC_CONFIG, "ns")))


@pytest.mark.parametrize("op, fields", [
    ("kv_put", dict(namespace=ORDER_TOPIC_CONFIG, key="T", value="broker-a:8")),
    ("kv_delete", dict(namespace=ORDER_TOPIC_CONFIG, key="T")),
    ("kv_put", dict(namespace="ns", key="k", value="w")),
    ("kv_put", dict(namespace="ns", key="new", value="w")),
    ("kv_delete", dict(namespace="ns", key="k")),
])
def test_a_write_that_cannot_be_made_durable_is_internal_and_changes_nothing(
        service, tmp_path, monkeypatch, op, fields):
    kv_path = tmp_path / "kv.json"
    before, file_before = observable(service), kv_path.read_bytes()
    failing_fsync(monkeypatch, kv_path)
    reply, events = zns1_events(service, op, **fields)
    assert isinstance(reply, schema.Error) and reply.code == "internal"
    assert "could not be written durably" in reply.message and "injected" in reply.message
    assert events == []
    assert observable(service) == before
    assert kv_path.read_bytes() == file_before
    # Once the disk works again, the same write goes through and the prev chain has no gap.
    monkeypatch.undo()
    _, events = zns1_ok_events(service, op, **fields)
    if fields["namespace"] == ORDER_TOPIC_CONFIG:
        [(_, event)] = events
        assert event.prev == before[1] and event.revision == before[0] + 1
    assert read_kv_file(kv_path).get(fields["namespace"], {}) == service.kv.list(
        fields["namespace"])


# --- --max-kv-bytes -------------------------------------------------------------------------


def test_max_kv_bytes_refuses_growth_and_applies_nothing(tmp_path):
    kv = KvStore(tmp_path / "kv.json")
    svc = NameService(kv, epoch="e" * 16, started_at_ms=0, limits=Limits(max_kv_bytes=30))
    zns1_ok_events(svc, "kv_put", namespace="ns", key="a", value="x" * 20)  # 2 + 1 + 20 = 23 bytes
    assert kv.total_bytes() == 23
    for key, value in (("b", "12345"), ("a", "x" * 28), ("ü", "1234")):
        reply, events = zns1_events(svc, "kv_put", namespace="ns", key=key, value=value)
        assert isinstance(reply, schema.Error) and reply.code == "bad_request", reply
        assert "max_kv_bytes (30)" in reply.message and "--max-kv-bytes" in reply.message
        assert events == [] and kv.list("ns") == {"a": "x" * 20}
    assert read_kv_file(tmp_path / "kv.json") == {"ns": {"a": "x" * 20}}
    zns1_ok_events(svc, "kv_put", namespace="ns", key="b", value="1234")  # exactly 30
    zns1_ok_events(svc, "kv_put", namespace="ns", key="a", value="short")  # shrinking is always allowed
    zns1_ok_events(svc, "kv_delete", namespace="ns", key="b")
    assert kv.total_bytes() == 2 + 1 + 5
    kv.close()


def test_max_kv_bytes_option_and_environment(serve_in_process):
    result, config = serve_in_process()
    assert result.exit_code == 0 and config.limits.max_kv_bytes == 64 * 1024 * 1024
    result, config = serve_in_process("--max-kv-bytes", "1000")
    assert result.exit_code == 0 and config.limits.max_kv_bytes == 1000
    result, config = serve_in_process(env={"ZNS_MAX_KV_BYTES": "2000"})
    assert result.exit_code == 0 and config.limits.max_kv_bytes == 2000
    assert serve_in_process("--max-kv-bytes", "0")[0].exit_code != 0
