"""The type checker runs in `make test`: mypy over zns/ (its settings in pyproject.toml) finds
nothing. Its cache (.mypy_cache, ignored by git) makes a second run take about a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)  # a first run without the cache, on a loaded machine
def test_mypy_finds_no_errors():
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
