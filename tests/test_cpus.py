"""zns.drivers.cpus: the check of `zns serve --cpus` at start."""

from __future__ import annotations

import os

import pytest

from zns.core.config import MAX_CPU, parse_cpus
from zns.core.errors import InvalidSetting
from zns.drivers import cpus

pytestmark = pytest.mark.timeout(60)


def test_the_cpus_refused_are_named_as_ranges_in_one_short_line() -> None:
    allowed = os.sched_getaffinity(0)
    outside = max(allowed) + 1
    with pytest.raises(InvalidSetting) as refused:
        cpus.check(parse_cpus(f"{outside}-{MAX_CPU},{min(allowed)}"))
    message = str(refused.value)
    assert f"CPU {outside}-{MAX_CPU}: not one this process may run on (" in message, message
    assert len(message) < 200 and "\n" not in message, message
