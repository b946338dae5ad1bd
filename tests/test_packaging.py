"""The package as users get it: a wheel built from the tree, installed into a fresh
virtualenv, whose `zns` command starts a NameServer and stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_wheel_installs_and_serves(tmp_path: Path):
    wheels = tmp_path / "wheels"
    # `pip wheel --no-deps` needs nothing beyond pip (it fetches the build backend
    # pyproject.toml names, as any user's build does).
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(wheels), str(REPO)], timeout=240, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = wheels.glob("zns-*.whl")
    # The license pyproject declares travels with the wheel, as the repository's LICENSE.
    with zipfile.ZipFile(wheel) as archive:
        [license_file] = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        shipped = archive.read(license_file).decode()
        metadata = archive.read(next(n for n in archive.namelist()
                                     if n.endswith(".dist-info/METADATA"))).decode()
    assert shipped == (REPO / "LICENSE").read_text()
    assert "Apache License" in shipped and "Version 2.0, January 2004" in shipped
    assert "License-Expression: Apache-2.0" in metadata
    venv = tmp_path / "venv"
    # Without a pip of its own (ensurepip costs more CPU than the rest of the install): this
    # pip installs into it (`pip --python`).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python, zns = venv / "bin" / "python", venv / "bin" / "zns"
    # The wheel and its declared dependencies, as `pip install zns` would.
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                                str(wheel)], timeout=240, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ZNS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    version = subprocess.run([str(zns), "--version"], capture_output=True, text=True,
                             timeout=60, env=env, cwd=tmp_path)
    assert version.returncode == 0 and re.search(r"zns, version \d", version.stdout), version
    # zns is imported from the venv's site-packages, not from the source tree.
    where = subprocess.run([str(python), "-c", "import zns; print(zns.__file__)"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert str(venv) in where.stdout, where
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(zns), "serve", "--router", "tcp://127.0.0.1:*", "--pub",
                                 "tcp://127.0.0.1:*", "--kv-path", str(tmp_path / "kv")],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while "serving requests on" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
        assert "zns stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
