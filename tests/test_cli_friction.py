"""Issue 34 item 5: what a new operator tripped over, each with its command. Each of these
failed before its fix (a traceback, a silent wait, a wrong culprit, a late failure)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import SplitServer
from zns.cli import main
from zns.drivers.security import write_keypair


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_a_kv_value_over_the_limit_is_a_usage_error_in_one_line():
    result = CliRunner().invoke(main, ["kv", "put", "NS", "K", "x" * 70_000,
                                       "--ns", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2
    assert one_line(result) == ("Error: Invalid value for VALUE: 70000 UTF-8 bytes, over the "
                                "65536 a KV value may have (see 'main kv put --help')")


def test_a_malformed_topic_to_watch_is_a_usage_error_before_any_socket():
    result = CliRunner().invoke(main, ["watch", "bad topic!", "--ns", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2
    assert one_line(result) == (
        "Error: Invalid value for TOPICS: 'bad topic!' is not a topic: 1-127 characters of "
        "[A-Za-z0-9_%|-] (see 'main watch --help')")


def test_a_bad_log_level_lists_the_valid_ones():
    result = CliRunner().invoke(main, ["serve", "--log-level", "TRACE"])
    assert result.exit_code == 2
    assert one_line(result).endswith("; one of DEBUG, INFO, WARNING, ERROR (any case)")


@pytest.mark.timeout(60)
def test_a_name_that_does_not_resolve_is_said_at_once():
    started = time.monotonic()
    result = CliRunner().invoke(main, ["status", "--ns", "tcp://no-such-host.invalid:9876",
                                       "--timeout", "20"])
    assert result.exit_code == 3
    assert "the name 'no-such-host.invalid' does not resolve" in one_line(result)
    assert time.monotonic() - started < 15  # not the 20 s timeout


@pytest.mark.timeout(60)
def test_no_answer_from_a_curve_server_says_it_may_need_the_key(tmp_path: Path):
    secret = write_keypair(tmp_path / "keys", "server")[1]
    srv = SplitServer(tmp_path, curve_secret=str(secret))
    try:
        result = CliRunner().invoke(main, ["status", "--ns", srv.router, "--timeout", "0.5"])
        assert result.exit_code == 3
        assert result.stderr.splitlines()[-1] == (
            f"zns: no answer from {srv.router} within 0.5 s (a CURVE server needs --server-key)")
    finally:
        srv.stop()


@pytest.mark.timeout(60)
def test_watch_blames_a_dead_events_endpoint_and_never_exits_0_without_it(tmp_path: Path):
    srv = SplitServer(tmp_path)
    try:
        srv.peer().ok("kv_put", namespace="ns", key="k", value="v")  # the NameServer answers
        result = CliRunner().invoke(main, ["watch", "--events", "tcp://127.0.0.1:1", "--count",
                                           "2", "--ns", srv.router, "--timeout", "0.5"])
        assert result.exit_code == 3
        assert result.stderr.splitlines()[-1] == (
            "zns: no events from tcp://127.0.0.1:1 within 2.5 s (no hb): is a relay (zns relay) "
            "or a NameServer's events socket there?")
        assert "trying the next NameServer" not in result.stderr
    finally:
        srv.stop()


def test_a_kv_path_where_no_file_can_be_created_is_refused_at_start(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "zns", "serve", "--router",
                             "tcp://127.0.0.1:*", "--pub", "tcp://127.0.0.1:*", "--kv-path",
                             "/proc/kv.log"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == ("Error: KV file /proc/kv.log cannot be created: no file can "
                                     "be created in /proc (No such file or directory) "
                                     "(--kv-path)")


@pytest.mark.timeout(60)
def test_a_kv_path_in_a_missing_directory_says_it_will_create_it(tmp_path: Path):
    missing = tmp_path / "nonexistent" / "dir"
    srv = SplitServer(tmp_path, kv_path=str(missing / "kv.log"))
    try:
        assert not missing.parent.exists()  # nothing made at start
        assert [line.split(" zns: ", 1)[1] for line in srv.output().splitlines()
                if "does not exist" in line] == [
            f"KV file {missing}/kv.log: directory {missing} does not exist; the first KV write "
            "creates it"]
    finally:
        srv.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("doc", ["README.md", "docs/security.md"])
def test_the_curve_recipe_runs_as_pasted(doc: str, tmp_path: Path):
    # Issue 34 item 5: step 3 failed as pasted (keys/admins was never created).
    import re

    text = (Path(__file__).resolve().parent.parent / doc).read_text()
    block = next(m[1] for m in re.finditer(r"```sh\n(.*?)```", text, re.S)
                 if "zns keygen keys/server ns" in m[1])
    script = block.replace("\\\n", " ")
    keygen = [line for line in script.splitlines() if line.startswith("zns keygen")]
    (serve,) = [line for line in script.splitlines() if line.startswith("zns serve")]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    for line in keygen:
        subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, check=True, timeout=60,
                       capture_output=True)
    ports = "--router tcp://127.0.0.1:* --pub tcp://127.0.0.1:* --kv-path kv.log"
    server = subprocess.Popen(["bash", "-c", f"exec {serve.split('#')[0]} {ports}"],
                              cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        for line in server.stderr:
            assert "Error" not in line, line
            if "serving requests on" in line:
                break
    finally:
        server.terminate()
        assert server.wait(30) == 0
