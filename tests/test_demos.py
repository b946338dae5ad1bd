"""Every `make demo*` target runs and exits 0 by itself, as the README says.

The recipes are read from the Makefile (so a new demo target is run too) and run
with this interpreter in place of the virtualenv's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPE = re.compile(r"^(demo[\w-]*):[^\n]*\n\t\$\(BIN\)/python (?P<args>[^\n]+)$", re.MULTILINE)
TARGETS = {m[1]: m["args"].split() for m in RECIPE.finditer((ROOT / "Makefile").read_text())}


def test_every_demo_target_is_found():
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert phony is not None
    assert sorted(TARGETS) == sorted(t for t in phony[1].split() if t.startswith("demo"))
    assert {"demo", "demo-peers"} <= set(TARGETS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_demo_target_runs_and_exits_by_itself(target: str):
    result = subprocess.run([sys.executable, *TARGETS[target]], cwd=ROOT, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 0, f"make {target}:\n{result.stdout}\n{result.stderr}"
