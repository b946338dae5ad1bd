"""bench/soak.py in miniature: a few seconds, a few dozen brokers, a few clients."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_soak_smoke(tmp_path):
    results = tmp_path / "soak.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--duration", "6", "--warmup", "2",
         "--brokers", "40", "--broker-procs", "2", "--topics-per-broker", "20",
         "--topic-pool", "400", "--clients", "4", "--client-procs", "1",
         "--topics-per-client", "20", "--churn-per-s", "10", "--restarts-per-min", "60",
         "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = results.read_text()
    assert text.startswith("## Soak")
    assert "lost registrations: 0; wrong or stale routes: 0 of 80" in text
    assert ", PASS" in text
