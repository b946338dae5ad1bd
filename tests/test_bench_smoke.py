"""Every benchmark runs end to end with tiny parameters, so the benchmarks never rot.

Only that each figure was measured and written is checked — never a timing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = ["throughput", "registration", "push_latency", "expiry", "scale", "kv", "partition",
           "remoting"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_and_writes_results(name: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--quick", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=55,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["machine"]["libzmq"] and doc["quick"] is True
    result = doc["benchmarks"][name]
    assert result["error"] is None
    assert result["figures"]
    markdown = (tmp_path / "results.md").read_text()
    for figure in result["figures"]:
        assert math.isfinite(figure["median"]) and figure["median"] >= 0, figure
        if figure["reference"]:
            assert figure["ratio"] is not None and figure["ratio"] > 0, figure
        if figure["target"]:
            assert isinstance(figure["met"], bool), figure
        assert figure["name"] in markdown
        assert figure["name"] in proc.stdout


@pytest.mark.timeout(60)
def test_remoting_runs_zns_only_without_a_jdk(tmp_path: Path) -> None:
    # No java on PATH: the Java NameServer's side is skipped, zns and the echo still measured.
    env = {k: v for k, v in os.environ.items() if k != "ZNS_REQUIRE_INTEROP"}
    env["PATH"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "bench.remoting", "--quick", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=55, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["remoting"]
    names = [figure["name"] for figure in result["figures"]]
    assert any(name.startswith("GET_ROUTEINFO_BY_TOPIC at saturation") for name in names)
    assert not any("Java" in name for name in names), names
    assert "the Java side was skipped: no JDK" in result["figures"][0]["note"]


def test_run_all_runs_every_script() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from bench.run_all import BENCHMARKS; print(*BENCHMARKS)"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert proc.stdout.split() == SCRIPTS, proc.stderr


def test_ratios_and_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.report import Figure, Target

    # Per-round ratios against the same round's reference; their median is the ratio.
    fig = Figure("x", "req/s", [90, 50, 80], "echo", [100, 100, 200],
                 Target("ratio", ">=", 0.85))
    assert fig.ratios == [0.9, 0.5, 0.4]
    assert fig.ratio == 0.5 and fig.met is False
    assert Figure("y", "ms", [3, 1, 2], target=Target("value", "<=", 2)).met is True
    assert Figure("z", "s", [10], "RocketMQ", [150]).ratio == pytest.approx(10 / 150)
