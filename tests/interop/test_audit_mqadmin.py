"""The audit trail with the real mqadmin (issue 34 item 2): its admin writes over remoting
(updateKvConfig, deleteKvConfig, wipeWritePerm, addWritePerm) each leave one INFO line
naming the source address, the value before and after, as fields in the JSON format.

mqadmin's deleteTopic is not among them: it deletes on the cluster's brokers first, and a
broker registered without a message store answers nothing; DELETE_TOPIC_IN_NAMESRV over
remoting is covered by tests/test_audit.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rocketmq
from helpers import Peer, ProcessServer, free_port, register_fields, wait_for

pytestmark = pytest.mark.interop


def audit_lines(server: ProcessServer) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.output().splitlines()
            if line.startswith("{") and '"audit: ' in line]


def mqadmin_ok(args: list[str], namesrv: str) -> rocketmq.Result:
    res = rocketmq.mqadmin(args, namesrv, timeout=120)
    assert res.rc == 0 and "Exception" not in res.stdout + res.stderr, res
    return res


@pytest.mark.timeout(480)
def test_mqadmin_admin_writes_leave_an_audit_trail(rocketmq_env: None, tmp_path: Path) -> None:
    port = free_port()
    remoting = f"127.0.0.1:{port}"
    server = ProcessServer(tmp_path, "--remoting", remoting, "--log-format", "json")
    peer = Peer(server.router)
    try:
        peer.ok("register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}}))
        mqadmin_ok(["updateKvConfig", "-s", "AUDIT", "-k", "k", "-v", "v1"], remoting)
        mqadmin_ok(["deleteKvConfig", "-s", "AUDIT", "-k", "k"], remoting)
        res = mqadmin_ok(["wipeWritePerm", "-b", "broker-a"], remoting)
        assert "OK, 2" in res.stdout, res
        mqadmin_ok(["addWritePerm", "-b", "broker-a"], remoting)
        lines = wait_for(lambda: (lambda got: got if len(got) >= 4 else None)(
            audit_lines(server)))
    finally:
        peer.close()
        server.stop()
    assert [{k: line[k] for k in ("level", "op", "target", "by", "before", "after")}
            for line in lines] == [
        {"level": "INFO", "op": "kv_put", "target": "AUDIT/k", "by": "127.0.0.1",
         "before": None, "after": "v1"},
        {"level": "INFO", "op": "kv_delete", "target": "AUDIT/k", "by": "127.0.0.1",
         "before": "v1", "after": None},
        {"level": "INFO", "op": "wipe_write_perm", "target": "broker-a", "by": "127.0.0.1",
         "before": 2, "after": 0},
        {"level": "INFO", "op": "add_write_perm", "target": "broker-a", "by": "127.0.0.1",
         "before": 0, "after": 2},
    ]
    assert lines[0]["message"] == "audit: kv_put 'AUDIT/k' by '127.0.0.1': none -> 'v1'"
