"""What keeps the memory of `zns serve --workers N` down (bench/workers.py, workers_memory)."""

from __future__ import annotations

import subprocess
import sys


def test_serving_imports_no_asyncio_and_no_ssl() -> None:
    """zmq.auth.thread (CURVE's ZAP handler) and zmq.utils.monitor import asyncio, and with
    it ssl: some megabytes in every process, for nothing without CURVE."""
    code = ("import sys, zns.cli.serve, zns.drivers.state_process, zns.drivers.worker, "
            "zns.drivers.remoting_listener, zns.drivers.metrics; "
            "print(sorted(m for m in ('asyncio', 'ssl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"
