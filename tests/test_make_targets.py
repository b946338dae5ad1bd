"""Every target the Makefile advertises (its .PHONY line) is run by some test: this file's own,
or the one TESTED names. A new target without a test fails here."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# target -> where it runs (or why a test cannot run it).
TESTED = {
    "run": "tests/test_make_targets.py::test_make_run_serves_and_says_where_the_kv_store_is",
    "monitoring-tools": "tests/test_make_targets.py::test_make_monitoring_tools_is_quiet_when_present",
    "demo": "tests/test_demos.py (every demo* recipe)",
    "demo-peers": "tests/test_demos.py (every demo* recipe)",
    "bench": "tests/test_bench_smoke.py (every benchmark of bench.run_all, --quick) and "
             "test_make_bench_runs_every_benchmark here",
    "rocketmq-jars": "a prerequisite of make test (tests/interop need its jars)",
    "agent-jar": "a prerequisite of make test (tests/interop/test_agent*.py need the jar)",
    "test": "the whole suite: the lead's and CI's run (.ci/run)",
    "mutate": "hours: tools/mutate.py, run by hand (docs/development.md)",
    "clean": "removes the virtualenv these tests run in",
}


def phony() -> list[str]:
    found = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found is not None
    return found[1].split()


def make() -> str:
    found = shutil.which("make")
    if found is None:
        pytest.skip("make is not installed")
    return found


def test_every_advertised_target_has_its_test():
    assert sorted(phony()) == sorted(TESTED)


@pytest.mark.timeout(60)
def test_make_run_serves_and_says_where_the_kv_store_is(tmp_path: Path):
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("no .venv in this clone (make test makes it)")
    kv = tmp_path / "kv.log"
    args = f"--router tcp://127.0.0.1:* --pub tcp://127.0.0.1:* --kv-path {kv}"
    proc = subprocess.Popen([make(), "--no-print-directory", "run", f"ARGS={args}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "serving requests on" in line:
                break
        assert any(f"KV store in {kv}, kept across restarts" in line for line in lines), lines
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.timeout(120)
def test_make_monitoring_tools_is_quiet_when_present():
    if shutil.which("promtool") is None:
        pytest.skip("no promtool here: the target would install Debian's prometheus")
    result = subprocess.run([make(), "--no-print-directory", "-s", "monitoring-tools"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_make_bench_runs_every_benchmark():
    # The recipe (not run here: test_bench_smoke.py runs each benchmark, and checks that it
    # smokes every one bench.run_all runs) hands BENCH_ARGS to bench.run_all.
    result = subprocess.run([make(), "--no-print-directory", "-n", "bench",
                             "BENCH_ARGS=--quick"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip().splitlines()[-1] == ".venv/bin/python -m bench.run_all --quick"
