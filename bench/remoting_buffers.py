"""What remoting connections can make the server hold (issue 21 item 4), measured.

Each shape runs against a fresh `zns serve --remoting` in a subprocess; the
figure is the server's peak RSS (VmHWM) above its RSS once set up, against the
budget (--remoting-max-buffer-bytes, 256 MiB by default) plus 64 MiB:

- frames: N connections each announce a 16 MiB frame and send all but 64 KiB of it;
- pipeline: N connections each send 307 GET_ALL_TOPIC_LIST (5,000 topics
  registered) and never read;
- trickle: N connections each begin a frame and send one byte every 45 s.

    .venv/bin/python -m bench.remoting_buffers [--connections 4096] [--shapes frames,pipeline,trickle]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zns.core.remoting import RemotingCommand, encode_command
from zns.core.remoting.register import body_crc32

MIB = 1 << 20
FRAME = 16 * MIB
_REMOTING = re.compile(r"RocketMQ remoting listener on (\S+)")


def _status(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


class Server:
    def __init__(self, *args: str) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.log = Path(self.dir.name) / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZNS_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zns", "serve", "--router", "tcp://127.0.0.1:*", "--pub",
             "tcp://127.0.0.1:*", "--kv-path", str(Path(self.dir.name) / "kv"), "--remoting",
             "127.0.0.1:0", "--workers", "0", *args],  # the RSS read is this process's
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            match = _REMOTING.search(self.log.read_text())
            if match:
                host, port = match.group(1).rsplit(":", 1)
                self.addr = (host, int(port))
                return
            time.sleep(0.05)
        raise RuntimeError(self.log.read_text())

    def rss(self) -> float:
        return _status(self.proc.pid, "VmRSS")

    def peak(self) -> float:
        return _status(self.proc.pid, "VmHWM")

    def close(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:  # a server deep in replies nobody reads
            self.proc.kill()
            self.proc.wait(30)
        text = self.log.read_text()
        self.dir.cleanup()
        return text


def _connect(addr: tuple[str, int], n: int) -> list[socket.socket]:
    socks = []
    for i in range(n):
        # From 127.0.0.1-4: --remoting-max-connections-per-host allows 1,024 from one address.
        s = socket.create_connection(addr, source_address=(f"127.0.0.{1 + i % 4}", 0))
        s.setblocking(False)
        socks.append(s)
    return socks


def _call(addr: tuple[str, int], cmd: RemotingCommand) -> socket.socket:
    """Send `cmd`, read its reply; the connection stays open (a broker's registration
    lasts as long as its connection)."""
    s = socket.create_connection(addr, timeout=30)
    s.sendall(encode_command(cmd))
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    left = struct.unpack(">i", head)[0]
    while left:
        left -= len(s.recv(min(left, 1 << 16)))
    return s


def _register_topics(addr: tuple[str, int], count: int) -> socket.socket:
    table = {f"Topic-{i:05d}": {"topicName": f"Topic-{i:05d}", "readQueueNums": 4,
                                "writeQueueNums": 4, "perm": 6} for i in range(count)}
    body = json.dumps({"topicConfigSerializeWrapper": {"dataVersion": {"counter": 1},
                                                       "topicConfigTable": table}}).encode()
    ext = {"brokerId": "0", "bodyCrc32": str(body_crc32(body)), "clusterName": "C",
           "brokerAddr": "127.0.0.1:10911", "haServerAddr": "", "compressed": "false",
           "brokerName": "b"}
    return _call(addr, RemotingCommand(code=103, version=479, ext_fields=ext, body=body))


def _pump(socks: list[socket.socket], payloads: list[bytes], seconds: float,
          server: Server, samples: list[float]) -> int:
    """Send each socket its payload without blocking; returns how many the server closed."""
    sel = selectors.DefaultSelector()
    left = {s: memoryview(p) for s, p in zip(socks, payloads)}
    for s in socks:
        sel.register(s, selectors.EVENT_WRITE)
    closed = 0
    deadline = time.monotonic() + seconds
    next_sample = 0.0
    while left and time.monotonic() < deadline:
        if time.monotonic() >= next_sample:
            samples.append(server.rss())
            next_sample = time.monotonic() + 0.2
        for key, _ in sel.select(0.2):
            s = key.fileobj
            try:
                sent = s.send(left[s][:256 << 10])
                left[s] = left[s][sent:]
                done = not left[s]
            except OSError:
                closed += 1
                done = True
            if done:
                sel.unregister(s)
                del left[s]
    return closed


def _server_closed(socks: list[socket.socket]) -> int:
    closed = 0
    for s in socks:
        try:
            while True:
                if s.recv(1 << 16) == b"":
                    closed += 1
                    break
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def run_shape(shape: str, n: int, args: list[str]) -> dict:
    server = Server(*args)
    try:
        broker = _register_topics(server.addr, 5000) if shape == "pipeline" else None
        time.sleep(0.5)
        base = server.rss()
        socks = _connect(server.addr, n)
        samples: list[float] = []
        started = time.monotonic()
        if shape == "frames":
            payload = struct.pack(">i", FRAME - 4) + b"\0" * (FRAME - 4 - (64 << 10))
            closed = _pump(socks, [payload] * n, 120, server, samples)
        elif shape == "pipeline":
            request = encode_command(RemotingCommand(code=206, version=479))
            closed = _pump(socks, [request * 307] * n, 60, server, samples)
            end = time.monotonic() + 40  # the server answers them slowly: watch it grow
            while time.monotonic() < end:
                samples.append(server.rss())
                time.sleep(0.2)
        else:  # trickle: a frame begun, then a byte every 45 s
            _pump(socks, [struct.pack(">i", 100) + b"\0"] * n, 30, server, samples)
            end = time.monotonic() + 50
            sent_at = time.monotonic()
            while time.monotonic() < end:
                samples.append(server.rss())
                if time.monotonic() - sent_at >= 45:
                    for s in socks:
                        try:
                            s.send(b"\0")
                        except OSError:
                            pass
                    sent_at = time.monotonic()
                time.sleep(0.5)
            closed = 0
        closed = max(closed, _server_closed(socks))
        result = {"shape": shape, "connections": n, "closed_by_server": closed,
                  "seconds": round(time.monotonic() - started, 1),
                  "peak_over_base_mib": round(server.peak() - base, 1),
                  "sampled_peak_over_base_mib": round(max(samples, default=base) - base, 1)}
        for s in socks:
            s.close()
        if broker is not None:
            broker.close()
        return result
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=4096)
    parser.add_argument("--shapes", default="frames,pipeline,trickle")
    parser.add_argument("serve_args", nargs="*")
    ns = parser.parse_args()
    for shape in ns.shapes.split(","):
        print(json.dumps(run_shape(shape, ns.connections, ns.serve_args)), flush=True)


if __name__ == "__main__":
    main()
