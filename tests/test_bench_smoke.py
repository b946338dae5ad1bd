"""Every benchmark runs end to end with tiny parameters, so the benchmarks never rot.

Only that each figure was measured and written is checked — never a timing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.harness import run_in_group  # noqa: E402
SCRIPTS = ["throughput", "registration", "push_latency", "expiry", "scale", "kv", "partition",
           "flood", "ops", "remoting", "remoting_load", "replication", "memory"]
# Smoked on its own below: it starts real RocketMQ brokers and Java applications (2.5 min
# --quick on a 2-core machine), so it needs the interop environment.
JAVA_SCRIPTS = ["agent"]


# A deadline for the script to finish (a --quick run is ~5-15 s quiet; under load 27 some took
# over 55 s), inside the test's own timeout so a slow run fails as a slow run, killed.
SCRIPT_DEADLINE = 200
JAVA_DEADLINE = 480


@pytest.mark.timeout(SCRIPT_DEADLINE + 40)
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_and_writes_results(name: str, tmp_path: Path) -> None:
    check_script(name, tmp_path, SCRIPT_DEADLINE)


@pytest.mark.interop
@pytest.mark.timeout(JAVA_DEADLINE + 40)
@pytest.mark.parametrize("name", JAVA_SCRIPTS)
def test_java_script_runs_and_writes_results(name: str, rocketmq_env: None,
                                             tmp_path: Path) -> None:
    check_script(name, tmp_path, JAVA_DEADLINE)


# bench/workers.py: one script, a benchmark (a results.md section) per item of issue 30's
# item 7; not in `make bench`, so smoked here. It starts no JVM with --quick.
WORKERS_BENCHMARKS = ["workers_reads", "workers_lag", "workers_storm", "workers_memory",
                      "workers_recovery"]


@pytest.mark.timeout(SCRIPT_DEADLINE + 40)
def test_workers_script_runs_and_writes_results(tmp_path: Path) -> None:
    check_script("workers", tmp_path, SCRIPT_DEADLINE, WORKERS_BENCHMARKS)


def check_script(name: str, tmp_path: Path, deadline: float,
                 benchmarks: list[str] | None = None) -> None:
    """`python -m bench.NAME --quick` exits 0 and writes every figure it printed, of every
    one of its `benchmarks` (default: the one named NAME)."""
    proc = run_in_group([sys.executable, "-m", f"bench.{name}", "--quick", "--out",
                         str(tmp_path)], cwd=REPO, timeout=deadline)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["machine"]["libzmq"] and doc["quick"] is True
    assert list(doc["benchmarks"]) == (benchmarks or [name])
    markdown = (tmp_path / "results.md").read_text()
    for bench in benchmarks or [name]:
        check_figures(doc["benchmarks"][bench], markdown, proc.stdout)


def check_figures(result: dict[str, Any], markdown: str, stdout: str) -> None:
    assert result["error"] is None
    assert result["figures"]
    for figure in result["figures"]:
        assert math.isfinite(figure["median"]) and figure["median"] >= 0, figure
        if figure["reference"] and any(figure["reference_rounds"] or ()):
            # A ratio whenever the reference measured something; a quick round on a loaded
            # machine can measure 0 (CPU time has clock-tick resolution): then there is none.
            assert figure["ratio"] is not None and figure["ratio"] >= 0, figure
        if figure["target"]:
            assert isinstance(figure["met"], bool), figure
        assert figure["name"] in markdown
        assert figure["name"] in stdout


@pytest.mark.timeout(SCRIPT_DEADLINE + 40)
def test_remoting_runs_zns_only_without_a_jdk(tmp_path: Path) -> None:
    # No java on PATH: the Java NameServer's side is skipped, zns and the echo still measured.
    env = {k: v for k, v in os.environ.items() if k != "ZNS_REQUIRE_INTEROP"}
    env["PATH"] = str(tmp_path)
    proc = run_in_group([sys.executable, "-m", "bench.remoting", "--quick", "--out",
                         str(tmp_path)], cwd=REPO, timeout=SCRIPT_DEADLINE, env=env)
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
    assert proc.stdout.split() == SCRIPTS + JAVA_SCRIPTS, proc.stderr


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


def test_a_partial_run_keeps_the_other_benchmarks_results(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.report import BenchResult, Figure, RunConfig, Target, as_json, markdown
    from bench.report import merge_json, merge_markdown

    def bench(name: str, value: float) -> BenchResult:
        fig = Figure(f"{name} rate", "req/s", [value], "echo", [100.0], Target("ratio", ">=", 1))
        return BenchResult(name, f"{name} title", f"{name} method", [fig])

    info = {"date": "d", "nproc": 2, "cpu": "c", "platform": "p", "load_average": (0, 0, 0),
            "python": "3", "pyzmq": "z", "libzmq": "l", "msgspec": "m", "zns": "0",
            "commit": "abc"}
    config = RunConfig(quick=False, rounds=1, workdir=tmp_path)
    old = [bench("alpha", 50.0), bench("beta", 60.0)]
    md = merge_markdown(markdown(old, info, config), [bench("beta", 70.0), bench("gamma", 80.0)],
                        info, config)
    assert md.count("## alpha title") == md.count("## beta title") == md.count("## gamma title") == 1
    assert "| alpha | alpha rate | 50.0 req/s |" in md  # kept
    assert "| beta | beta rate | 70.0 req/s |" in md and "60.0 req/s" not in md  # replaced
    assert "| gamma | gamma rate | 80.0 req/s |" in md  # added
    assert "- `beta` rerun alone" in md and "- `alpha` rerun" not in md
    assert md.index("## alpha title") < md.index("## beta title") < md.index("## gamma title")
    doc = json.loads(merge_json(as_json(old, info, config), [bench("beta", 70.0)], info, config))
    assert list(doc["benchmarks"]) == ["alpha", "beta"]
    assert doc["benchmarks"]["alpha"]["figures"][0]["median"] == 50.0
    assert doc["benchmarks"]["beta"]["figures"][0]["median"] == 70.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"  # a zombie has ended; only its parent has not read its status yet


@pytest.mark.timeout(60)
def test_a_timed_out_benchmark_takes_the_processes_it_started_with_it() -> None:
    started = ("import subprocess, sys, time\n"
               "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
               "print(child.pid, flush=True)\n"
               "time.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_in_group([sys.executable, "-c", started], timeout=5, grace=2)
    child = int(info.value.output.split()[0])
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


@pytest.mark.timeout(90)
def test_a_terminated_benchmark_stops_its_servers_and_removes_its_folder() -> None:
    script = ("import os, signal, sys, time\n"
              "from bench.harness import start_zns\n"
              "from bench.report import cli\n"
              "def slow(config):\n"
              "    with start_zns(config.workdir / 's') as server:\n"
              "        print(server.proc.pid, config.workdir, flush=True)\n"
              "        os.kill(os.getpid(), signal.SIGTERM)\n"
              "        time.sleep(60)\n"
              "sys.exit(cli({'slow': slow}, ['--quick']))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=80)  # no group: the benchmark must clean up itself
    assert proc.returncode == 128 + 15, proc.stderr
    pid, workdir = proc.stdout.split()[:2]
    assert not alive(int(pid)) and not Path(workdir).exists()


@pytest.mark.timeout(30)
def test_wait_paired_notes_a_server_that_never_pairs(tmp_path: Path) -> None:
    """A machine that is never quiet (a loaded CI runner) never pairs a server: the benchmark
    measures it as it is and says so on its figures, instead of failing."""
    from bench.harness import QUICK_PAIR_WAIT_S, ServerProcess, wait_paired
    log = tmp_path / "zns.log"
    log.write_text("worker 1 started\n")
    with subprocess.Popen(["sleep", "60"]) as proc:
        try:
            server = ServerProcess(proc, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", log)
            began = time.monotonic()
            note = wait_paired(server, ("--workers", "1"), quick=True)
            assert note.startswith(f"not paired within {QUICK_PAIR_WAIT_S:g} s")
            assert time.monotonic() - began >= QUICK_PAIR_WAIT_S
            assert wait_paired(server, ("--workers", "0")) == ""  # never paired
            assert wait_paired(server, ("--workers", "1", "--cpus", "off")) == ""
            log.write_text("zns: the state process and worker 1 share CPU 1 while their "
                           "work is light\n")
            assert wait_paired(server, ("--workers", "1"), quick=True) == ""
        finally:
            proc.kill()
