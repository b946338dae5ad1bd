"""KV crash safety: SIGKILL the server mid-stream; every acknowledged write survives."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from helpers import LOADED_DEADLINE, Peer
from zns.core import schema
from zns.drivers.kv_file import KvStore, read_kv_file

NAMESPACE = "crash"
KEYS = [f"k{i}" for i in range(16)]
ROUNDS = 6


@pytest.mark.timeout(120)
def test_acknowledged_kv_writes_survive_sigkill(process_server, tmp_path, capsys):
    kv_path = tmp_path / "kv.json"
    rnd = random.Random(20261130)
    model: dict[str, str] = {}  # what every acknowledged write says is there
    acknowledged = 0
    uncertain = None  # (key, value before, value after) of the write a kill cut short
    for round_no in range(ROUNDS):
        srv = process_server(kv_path=kv_path)
        peer = Peer(srv.router)
        # After a restart: every acknowledged write, and the cut one either way.
        assert_matches(peer.ok("kv_list", namespace=NAMESPACE).entries, model, uncertain)
        if uncertain is not None:  # now settled: read what the restart kept
            model[uncertain[0]] = peer.ok("kv_list", namespace=NAMESPACE).entries.get(
                uncertain[0])
            if model[uncertain[0]] is None:
                del model[uncertain[0]]
        uncertain = None
        killer = threading.Timer(rnd.uniform(0.05, 0.6), srv.proc.kill)
        killer.start()
        seq = 0
        try:
            while True:
                key = rnd.choice(KEYS)
                value = None if rnd.random() < 0.3 else f"r{round_no}-{seq}-" + "v" * rnd.randint(
                    0, 2000)
                seq += 1
                uncertain = (key, model.get(key), value)
                if value is None:
                    request = {"op": "kv_delete", "namespace": NAMESPACE, "key": key}
                else:
                    request = {"op": "kv_put", "namespace": NAMESPACE, "key": key, "value": value}
                if not acknowledged_before_death(peer, srv.proc, seq, request):
                    break
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
                acknowledged += 1
                uncertain = None
        finally:
            killer.cancel()
            peer.close()
            srv.proc.wait(10)
        # Never corrupt: the file at kv_path always reads (a torn last record aside).
        on_disk = read_kv_file(kv_path)
        assert_matches(on_disk.get(NAMESPACE, {}), model, uncertain)

    srv = process_server(kv_path=kv_path)
    peer = Peer(srv.router)
    assert_matches(peer.ok("kv_list", namespace=NAMESPACE).entries, model, uncertain)
    peer.close()
    assert acknowledged > ROUNDS
    with capsys.disabled():
        print(f"\nkv crash: {ROUNDS} SIGKILLs, {acknowledged} acknowledged writes, none lost")


def acknowledged_before_death(peer: Peer, proc: subprocess.Popen, seq: int,
                              request: dict[str, Any]) -> bool:
    """Send one write: True when it is acknowledged; False as soon as the server has died
    (the kill cut it short, so it may or may not have landed: the caller's `uncertain`).
    Watching the process instead of waiting out a reply timeout after each kill."""
    peer.send_raw(schema.encode({**request, "id": seq}))
    deadline = time.monotonic() + LOADED_DEADLINE
    while not peer.dealer.poll(20):
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, "no reply, yet the server is alive"
    reply = schema.decode_reply(peer.recv_raw()[-1])
    assert not isinstance(reply, schema.Error) and reply.id == seq, reply
    return True


def assert_matches(entries: dict[str, str], model: dict[str, str], uncertain) -> None:
    if uncertain is None:
        assert entries == model
        return
    key, before, after = uncertain
    rest = {k: v for k, v in entries.items() if k != key}
    assert rest == {k: v for k, v in model.items() if k != key}
    assert entries.get(key) in (before, after)


# A writer that acknowledges on stdout: "w <key> <value or ->" before each write, "ok" after.
WRITER = """
import random, sys
from zns.drivers.kv_file import KvStore
store = KvStore(sys.argv[1], compact_min_bytes=4000, step_bytes=1000)
rnd = random.Random(int(sys.argv[2]))
i = 0
while True:
    key = f"k{rnd.randrange(40)}"
    value = None if rnd.random() < 0.3 else f"{sys.argv[2]}-{i}-" + "v" * rnd.randrange(400)
    print("w", key, value if value is not None else "-", flush=True)
    if value is None:
        store.delete("ns", key)
    else:
        store.put("ns", key, value)
    print("ok", flush=True)
    i += 1
"""


@pytest.mark.timeout(120)
def test_sigkill_mid_compaction_loses_nothing(tmp_path):
    """SIGKILL a KvStore writer that compacts every few hundred writes, half of the rounds
    while `<path>.next` exists; every acknowledged write is there after a restart."""
    kv_path = tmp_path / "kv.json"
    nxt = tmp_path / "kv.json.next"
    rnd = random.Random(1130)
    model: dict[str, str] = {}
    mid_compaction = 0
    for round_no in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(kv_path), str(round_no)],
                                stdout=subprocess.PIPE, text=True)
        acks, want_next = 0, round_no % 2 == 0
        limit = rnd.randrange(20, 400)
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            acks += line == "ok\n"
            if acks >= limit and (not want_next or nxt.exists()):
                break
            assert acks < 20_000, "no compaction seen"
        mid_compaction += nxt.exists()
        proc.kill()
        lines.extend(proc.stdout.read().splitlines(keepends=True))
        proc.wait(10)
        uncertain = None
        for line in lines:
            if line.startswith("w "):
                _, key, value = line.rstrip("\n").split(" ", 2)
                uncertain = (key, model.get(key), None if value == "-" else value)
            elif line == "ok\n":
                key, _, after = uncertain
                if after is None:
                    model.pop(key, None)
                else:
                    model[key] = after
                uncertain = None
        store = KvStore(kv_path)  # recovers: replays .next, cuts a torn tail
        try:
            entries = store.list("ns")
        finally:
            store.close()
        assert_matches(entries, model, uncertain)
        assert not nxt.exists()
        model = entries
    assert mid_compaction >= 3
