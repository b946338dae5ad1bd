"""Every code block of README.md and docs/ that claims to run is run, as written.

A block claims to run when the line before its fence is a marker:

- `<!-- runs -->`: it exits 0 by itself;
- `<!-- runs until stopped -->`: it keeps running (a watcher, a server) and has not
  failed after a few seconds; with `, printing` it has printed something by then.

Each runs in its own Python process against a live NameServer on ephemeral
ports, named by `ZNS_ADDR` (a block that spells out the default endpoint gets
the server's instead), where a broker serves the topic `Orders`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import SplitServer
from zns.drivers.broker_agent import BrokerAgent
from zns.core.schema import BROKER_PREFIX, DEFAULT_ROUTER, HB_CHANNEL, BrokerEvent

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKED = re.compile(r"^<!-- runs(?P<options>[^>]*)-->\n```(?P<lang>\w+)\n(?P<code>.*?)^```",
                    re.MULTILINE | re.DOTALL)
FENCE = re.compile(r"^```python\n", re.MULTILINE)
STOPPED_AFTER_S = 4.0
TIMEOUT_S = 60


@dataclass
class Block:
    where: str
    options: str
    lang: str
    code: str


def marked_blocks() -> list[Block]:
    blocks = []
    for path in DOCS:
        text = path.read_text()
        for m in MARKED.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            blocks.append(Block(f"{path.relative_to(ROOT)}:{line}", m["options"].strip(),
                                m["lang"], m["code"]))
    return blocks


BLOCKS = marked_blocks()


def test_the_readmes_python_blocks_all_claim_to_run_and_are_found():
    """A README Python block is for pasting: each one is marked (and so run)."""
    readme = (ROOT / "README.md").read_text()
    assert len(FENCE.findall(readme)) == sum(
        1 for b in BLOCKS if b.where.startswith("README.md") and b.lang == "python")
    assert len(BLOCKS) >= 4


@pytest.fixture(scope="module")
def orders_server(tmp_path_factory: pytest.TempPathFactory):
    server = SplitServer(tmp_path_factory.mktemp("docs"))
    agent = BrokerAgent(server.router, cluster="DocCluster", broker_name="broker-docs",
                        broker_addr="127.0.0.1:10999", topics=["Orders"])
    assert agent.wait_registered(timeout=20)
    yield server
    agent.close()
    server.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_a_block_that_claims_to_run_runs(block: Block, orders_server, tmp_path: Path):
    assert block.lang == "python", f"{block.where}: only Python blocks are run"
    code = block.code.replace(DEFAULT_ROUTER, orders_server.router)
    watcher = orders_server.peer()  # a broker block must really register its broker
    watcher.subscribe(BROKER_PREFIX, HB_CHANNEL)
    watcher.wait_subscribed()
    env = {"ZNS_ADDR": orders_server.router, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if "until stopped" in block.options:
            deadline = time.monotonic() + STOPPED_AFTER_S
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None, f"{block.where} stopped by itself: {proc.communicate()}"
            proc.terminate()
            out, err = proc.communicate(timeout=TIMEOUT_S)
            assert "Traceback" not in err.replace("KeyboardInterrupt", ""), err
            if "printing" in block.options:
                assert out.strip(), f"{block.where} printed nothing: {err}"
        else:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, f"{block.where} exited {proc.returncode}:\n{err}"
            assert "not registered" not in out, out
            for name in re.findall(r'BrokerAgent\(.*?broker_name="([^"]+)"', code, re.DOTALL):
                watcher.next_event(lambda _ch, ev: isinstance(ev, BrokerEvent)
                                   and ev.broker_name == name and ev.change == "registered")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_nothing_installs_zns_as_if_it_were_on_a_package_index():
    """zns is installed from a clone or a wheel built from one: no `pip install zns...`."""
    texts = [*DOCS, *sorted((ROOT / "zns").rglob("*.py")), ROOT / "Makefile"]
    offending = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in texts
                 for m in re.finditer(r"pip install '?zns\b[^\n]*", path.read_text())]
    assert offending == []
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/zns" in readme and "source .venv/bin/activate" in readme
