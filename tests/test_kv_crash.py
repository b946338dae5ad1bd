"""KV crash safety: SIGKILL the server mid-stream; every acknowledged write survives."""

from __future__ import annotations

import random
import threading

import pytest

from conftest import Peer
from zns.drivers.kv_file import read_kv_file

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
                try:
                    if value is None:
                        peer.ok("kv_delete", timeout=3, namespace=NAMESPACE, key=key)
                    else:
                        peer.ok("kv_put", timeout=3, namespace=NAMESPACE, key=key, value=value)
                except AssertionError:
                    assert srv.proc.poll() is not None, "no reply, yet the server is alive"
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


def assert_matches(entries: dict[str, str], model: dict[str, str], uncertain) -> None:
    if uncertain is None:
        assert entries == model
        return
    key, before, after = uncertain
    rest = {k: v for k, v in entries.items() if k != key}
    assert rest == {k: v for k, v in model.items() if k != key}
    assert entries.get(key) in (before, after)
