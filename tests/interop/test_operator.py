"""What a RocketMQ operator migrating to zns meets first (issue 34 item 1), with the real
5.3.3 mqadmin: the Java NameServer's properties file starts zns in RocketMQ mode and
`mqadmin clusterList` works against it; mqadmin pointed at a ZNS/1 port is warned about."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import rocketmq
from helpers import ProcessServer, free_port, wait_for

pytestmark = pytest.mark.interop


@pytest.mark.timeout(300)
def test_the_java_properties_file_serves_mqadmin_cluster_list(rocketmq_env: None,
                                                              tmp_path: Path) -> None:
    port = free_port()
    properties = tmp_path / "namesrv.properties"
    properties.write_text(f"# as mqnamesrv -c takes it\nlistenPort={port}\nbindAddress=127.0.0.1\n"
                          "orderMessageEnable=true\nserverWorkerThreads = 8\n")
    server = ProcessServer(tmp_path, "--namesrv-config", str(properties))
    broker = subprocess.Popen(
        [sys.executable, "-m", "zns", "broker", "--cluster", "OpsCluster", "--name", "ops-b1",
         "--addr", "127.0.0.1:10911", "--ns", server.router], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        out = server.output()
        assert f"{properties}: serverWorkerThreads: ignored: zns has no Netty worker threads" in out
        assert f"RocketMQ remoting listener on 127.0.0.1:{port}" in out

        def listed() -> str | None:
            res = rocketmq.mqadmin(["clusterList"], f"127.0.0.1:{port}")
            return res.stdout if "ops-b1" in res.stdout else None

        shown = wait_for(listed, timeout=120)
        assert "OpsCluster" in shown
    finally:
        broker.terminate()
        broker.wait(15)
        server.stop()


@pytest.mark.timeout(300)
def test_mqadmin_at_the_zns1_port_is_warned_about_naming_remoting(rocketmq_env: None,
                                                                  tmp_path: Path) -> None:
    server = ProcessServer(tmp_path)  # no --remoting: what `make run` starts
    try:
        zns1 = server.router.removeprefix("tcp://")
        res = rocketmq.mqadmin(["clusterList"], zns1, stock=True, timeout=120)
        assert "Exception" in res.stdout + res.stderr, res  # it fails, as the issue says
        line = wait_for(lambda: next((ln for ln in server.output().splitlines()
                                      if "closed before completing the ZeroMQ handshake" in ln),
                                     None))
        assert "WARNING" in line and "--remoting HOST:PORT" in line and zns1 in line
    finally:
        server.stop()
