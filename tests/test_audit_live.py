"""The audit trail live: `zns serve --log-format json` and the `zns` CLI as an operator runs
them, plain and under CURVE (where the line names the admin key by its name)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Peer, ProcessServer, register_fields, wait_for

pytestmark = pytest.mark.timeout(120)

AUDIT_FIELDS = ("op", "target", "by", "before", "after")


def zns(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "zns", *args, "--timeout", "10"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def audit_lines(server: ProcessServer) -> list[dict[str, Any]]:
    lines = []
    for line in server.output().splitlines():
        if line.startswith("{") and '"op"' in line:
            record = json.loads(line)
            message = re.sub(r"^worker \d+: ", "", record["message"])  # a worker names itself
            assert record["level"] == "INFO" and message.startswith("audit: ")
            lines.append({k: record[k] for k in AUDIT_FIELDS})
    return lines


@pytest.mark.parametrize("workers", ["0", "1"])
def test_the_cli_admin_commands_leave_an_audit_trail(tmp_path: Path, workers: str) -> None:
    # With a worker, the line is the worker's, which names the sender as a single process does
    server = ProcessServer(tmp_path, "--log-format", "json", "--workers", workers)
    peer = Peer(server.router)
    try:
        peer.ok("register_broker", **register_fields(topics={"TopicA": {}, "TopicB": {}}))
        ns = server.router
        zns("wipe-write-perm", "broker-a", "--ns", ns)
        zns("add-write-perm", "broker-a", "--ns", ns)
        zns("delete-topic", "TopicB", "--ns", ns)
        zns("kv", "put", "app", "k", "v1", "--ns", ns)
        zns("kv", "put", "app", "k", "v2", "--ns", ns)
        zns("kv", "delete", "app", "k", "--ns", ns)
        # A periodic re-registration is not an admin write; a displacing one is.
        peer.ok("register_broker", **register_fields(topics={"TopicA": {}}))
        peer.ok("register_broker", **register_fields(addr="10.0.0.9:10911", topics={},
                                                     data_version={"state": 1}))
        lines = wait_for(lambda: (lambda got: got if len(got) >= 7 else None)(
            audit_lines(server)))
    finally:
        peer.close()
        server.stop()
    by = {line.pop("by") for line in lines}
    assert len(by) == 1 and "127.0.0.1" in by.pop()  # the CLI's (and the peer's) address
    assert lines == [
        {"op": "wipe_write_perm", "target": "broker-a", "before": 2, "after": 0},
        {"op": "add_write_perm", "target": "broker-a", "before": 0, "after": 2},
        {"op": "delete_topic", "target": "TopicB", "before": 1, "after": 0},
        {"op": "kv_put", "target": "app/k", "before": None, "after": "v1"},
        {"op": "kv_put", "target": "app/k", "before": "v1", "after": "v2"},
        {"op": "kv_delete", "target": "app/k", "before": "v2", "after": None},
        {"op": "register_broker", "target": "c1/broker-a id 0",
         "before": "c1/broker-a id 0 at 10.0.0.1:10911", "after": "10.0.0.9:10911"},
    ]


def test_under_curve_the_line_names_the_admin_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    zns_plain = [sys.executable, "-m", "zns"]
    for directory, name in (("server", "ns"), ("admins", "ops-alice")):
        subprocess.run([*zns_plain, "keygen", str(keys / directory), name], check=True,
                       capture_output=True, timeout=60)
    server = ProcessServer(tmp_path, "--log-format", "json",
                           "--curve-secret", str(keys / "server" / "ns.key_secret"),
                           "--admins-keys", str(keys / "admins"))
    try:
        zns("kv", "put", "app", "k", "v1", "--ns", server.router,
            "--server-key", str(keys / "server" / "ns.key"),
            "--keypair", str(keys / "admins" / "ops-alice.key_secret"))
        [line] = wait_for(lambda: audit_lines(server))
    finally:
        server.stop()
    assert line == {"op": "kv_put", "target": "app/k", "by": "key ops-alice", "before": None,
                    "after": "v1"}
