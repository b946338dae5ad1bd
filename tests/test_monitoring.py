"""monitoring/: the alert rules and the Grafana dashboard, checked by Prometheus's own promtool
(issue 34 item 3): the rules load, each alert fires and stays quiet on synthetic series
(monitoring/zns-alerts.test.yml), every dashboard query parses, and every zns metric they name
is one a real server exports. Without promtool the promtool checks skip with the reason;
ZNS_REQUIRE_INTEROP=1 (CI) makes that a failure (`make test` installs it where it can)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ProcessServer, ThreadedServer, wait_for

MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
ALERTS = MONITORING / "zns-alerts.yml"
ALERT_TESTS = MONITORING / "zns-alerts.test.yml"
DASHBOARD = MONITORING / "zns-dashboard.json"
# A metric name in PromQL: what is not a function, a keyword or a label.
NAME = re.compile(r"\b((?:zns|process)_[a-z0-9_]+)\b")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = ("promtool not found: install Debian's prometheus package (make test does, "
                  "as root with apt-get)")
        if os.environ.get("ZNS_REQUIRE_INTEROP") == "1":
            pytest.fail(reason + "; ZNS_REQUIRE_INTEROP=1")
        pytest.skip(reason)
    return found


def run_promtool(*args: str, cwd: Path = MONITORING) -> str:
    result = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def alert_expressions() -> list[str]:
    return re.findall(r"^\s+expr: (.+)$", ALERTS.read_text(), re.M)


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


@pytest.mark.timeout(120)
def test_the_alert_rules_load_and_each_alert_fires_and_stays_quiet():
    assert "SUCCESS: 16 rules found" in run_promtool("check", "rules", ALERTS.name)
    assert "SUCCESS" in run_promtool("test", "rules", ALERT_TESTS.name)
    alerts = re.findall(r"^\s+- alert: (\w+)$", ALERTS.read_text(), re.M)
    firing = set(re.findall(r"^\s+alertname: (\w+)$", ALERT_TESTS.read_text(), re.M))
    assert len(alerts) == 16 and set(alerts) == firing  # every alert has its unit test


@pytest.mark.timeout(120)
def test_every_dashboard_query_parses(tmp_path: Path):
    expressions = dashboard_expressions()
    assert len(expressions) >= 13
    # promtool checks PromQL in rule files: one recording rule per query.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"zns_dashboard:query_{n}", "expr": expr}
        for n, expr in enumerate(expressions)]}]}
    (tmp_path / "dashboard.rules.yml").write_text(json.dumps(rules))  # JSON is YAML
    out = run_promtool("check", "rules", "dashboard.rules.yml", cwd=tmp_path)
    assert f"SUCCESS: {len(expressions)} rules found" in out
    # The check can fail: a query that does not parse is refused.
    (tmp_path / "bad.rules.yml").write_text(json.dumps(
        {"groups": [{"name": "bad", "rules": [{"record": "x:y", "expr": "rate(zns_stalls_total[5m]"}]}]}))
    result = subprocess.run([promtool(), "check", "rules", "bad.rules.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def scrape_a_follower(tmp_path: Path) -> str:
    """The /metrics of a follower (zns.drivers.followers), of a NameServer with workers."""
    from test_metrics import get
    from zns.drivers.security import write_keypair

    server_public, server_secret = write_keypair(tmp_path / "keys", "server")
    follower_public, follower_secret = write_keypair(tmp_path / "keys", "follower")
    listed = tmp_path / "followers"
    listed.mkdir()
    (listed / "follower.key").write_bytes(Path(follower_public).read_bytes())
    (tmp_path / "main").mkdir()
    (tmp_path / "follower").mkdir()
    main = ProcessServer(tmp_path / "main", "--curve-secret", server_secret, "--followers",
                         "tcp://127.0.0.1:*", "--followers-keys", str(listed))
    try:
        endpoint = wait_for(lambda: re.findall(r"feeding followers on (\S+)", main.output()))[0]
        follower = ProcessServer(tmp_path / "follower", "--follow", endpoint,
                                 "--follow-server-key", server_public, "--follow-keypair",
                                 follower_secret, "--metrics", "127.0.0.1:0")
        try:
            port = wait_for(lambda: re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/",
                                               follower.output()))[0]
            status, text = get(f"http://127.0.0.1:{port}/metrics")
        finally:
            assert follower.stop() == 0
    finally:
        assert main.stop() == 0
    assert status == 200 and "zns_follower_silence_seconds " in text
    return text


@pytest.mark.timeout(120)
@pytest.mark.single_process("the metrics of --workers 0; a server with workers is scraped next")
def test_every_metric_named_is_one_a_server_exports(tmp_path: Path):
    # An alert on a misspelt metric never fires: each name must be in a real scrape.
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    from test_metrics import get

    srv = ThreadedServer(tmp_path, metrics="127.0.0.1:0", remoting="127.0.0.1:0")
    try:
        status, text = get(f"http://127.0.0.1:{srv.server.metrics.port}/metrics")
    finally:
        srv.stop()
    assert status == 200
    # And a server with workers: the series only they export (the replication, restarts).
    workers = ProcessServer(tmp_path, "--workers", "1", "--metrics", "127.0.0.1:0")
    try:
        port = wait_for(lambda: re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/",
                                           workers.output()))[0]
        status, more = wait_for(lambda: (got := get(f"http://127.0.0.1:{port}/metrics"))[0]
                                == 200 and "zns_worker_loaded{" in got[1] and got)
    finally:
        assert workers.stop() == 0
    text += more + scrape_a_follower(tmp_path)
    # A family with nothing counted yet has no sample but its HELP and TYPE: its sample names.
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",), "info": ("_info",)}
    exported = {family.name + suffix for family in text_string_to_metric_families(text)
                for suffix in suffixes.get(family.type, ("",))}
    named = {name for expr in alert_expressions() + dashboard_expressions()
             for name in NAME.findall(expr)}
    assert len(named) >= 15
    assert named <= exported, named - exported
