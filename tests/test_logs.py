"""zns.drivers.logs in process: the repeat filter's windows (the records' own clock, set by
the test), its summary line, JSON lines and configure_logging. No server, no waiting."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator

import pytest

from zns.drivers.logs import (
    BURST,
    PLAIN_FORMAT,
    WINDOW_S,
    JsonFormatter,
    RepeatFilter,
    configure_logging,
    install_repeat_filter,
)

pytestmark = pytest.mark.timeout(30)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[tuple[logging.Logger, _Keep]]:
    logger = logging.getLogger("zns.test.logs")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = _Keep()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)
    for existing in list(logger.filters):
        logger.removeFilter(existing)


def _record(logger: logging.Logger, created: float, msg: str = "broker %s refused",
            level: int = logging.WARNING, name: str | None = None) -> logging.LogRecord:
    record = logger.makeRecord(name or logger.name, level, __file__, 1, msg, ("b",), None)
    record.created = created
    return record


def test_the_defaults_are_20_warnings_per_10_seconds() -> None:
    repeat = RepeatFilter()
    assert (repeat.window_s, repeat.burst) == (WINDOW_S, BURST) == (10.0, 20)


def test_the_burst_passes_then_the_rest_of_the_window_is_held_back(kept) -> None:
    logger, handler = kept
    logger.addFilter(RepeatFilter(window_s=10, burst=3))
    for i in range(10):
        logger.handle(_record(logger, 1000.0 + i))
    assert len(handler.records) == 3


def test_a_new_window_starts_exactly_window_s_after_the_first_record(kept) -> None:
    logger, handler = kept
    logger.addFilter(RepeatFilter(window_s=10, burst=1))
    logger.handle(_record(logger, 1000.0))
    logger.handle(_record(logger, 1009.5))  # held back
    assert len(handler.records) == 1
    logger.handle(_record(logger, 1010.0))  # the window is over: the count, then the record
    messages = [r.getMessage() for r in handler.records]
    assert messages == ["broker b refused",
                        "1 more warnings like 'broker %s refused' were suppressed in the last 10 s",
                        "broker b refused"]
    summary = handler.records[1]
    assert summary.levelno == logging.WARNING and summary.name == logger.name
    assert summary.zns_summary is True
    # the new window started at 1010: one more passes at 1019.9, not before
    logger.handle(_record(logger, 1019.9))
    assert len(handler.records) == 3


def test_a_window_with_nothing_held_back_ends_without_a_summary(kept) -> None:
    logger, handler = kept
    logger.addFilter(RepeatFilter(window_s=10, burst=2))
    logger.handle(_record(logger, 1000.0))
    logger.handle(_record(logger, 1001.0))
    logger.handle(_record(logger, 1011.0))
    assert [r.getMessage() for r in handler.records] == ["broker b refused"] * 3


def test_the_summary_names_the_template_cut_to_80_characters_and_the_window(kept) -> None:
    logger, handler = kept
    logger.addFilter(RepeatFilter(window_s=2.5, burst=1))
    template = "x" * 100 + " %s"
    for at in (1000.0, 1000.1, 1000.2):
        logger.handle(_record(logger, at, template))
    logger.handle(_record(logger, 1003.0, template))
    assert handler.records[1].getMessage() == (
        f"2 more warnings like {'x' * 80!r} were suppressed in the last 2.5 s")


def test_templates_levels_and_loggers_are_counted_apart(kept) -> None:
    logger, handler = kept
    logger.addFilter(RepeatFilter(window_s=10, burst=1))
    logger.handle(_record(logger, 1000.0, "a %s"))
    logger.handle(_record(logger, 1000.0, "b %s"))
    logger.handle(_record(logger, 1000.0, "a %s", logging.ERROR))
    logger.handle(_record(logger, 1000.0, "a %s", name="zns.other"))
    logger.handle(_record(logger, 1000.0, "a %s"))  # the only repeat
    assert len(handler.records) == 4


def test_repeated_info_lines_are_folded_like_warnings(kept) -> None:
    # A peer announcing a restart with every `hb` wrote 850,000 INFO lines in 10 s.
    logger, handler = kept
    logger.addFilter(RepeatFilter(window_s=10, burst=2))
    for i in range(5):
        logger.handle(_record(logger, 1000.0 + i, "peer %s restarted", level=logging.INFO))
    logger.handle(_record(logger, 1010.0, "peer %s restarted", level=logging.INFO))
    assert [r.getMessage() for r in handler.records] == [
        "peer b restarted", "peer b restarted",
        "3 more lines like 'peer %s restarted' were suppressed in the last 10 s",
        "peer b restarted"]
    assert handler.records[2].levelno == logging.INFO


def test_below_info_nothing_is_limited_and_summaries_are_never_held(kept) -> None:
    logger, handler = kept
    repeat = RepeatFilter(window_s=10, burst=1)
    logger.addFilter(repeat)
    for _ in range(5):
        logger.handle(_record(logger, 1000.0, level=logging.DEBUG))
    assert len(handler.records) == 5
    summary = _record(logger, 1000.0)
    summary.zns_summary = True
    logger.handle(_record(logger, 1000.0))
    for _ in range(3):
        logger.handle(summary)
    assert len(handler.records) == 9
    warning_but_summary = _record(logger, 1000.0, level=logging.WARNING)
    assert repeat.filter(warning_but_summary) is False  # a plain repeat: held back


def test_the_window_map_is_bounded_at_10000_templates(kept) -> None:
    logger, handler = kept
    repeat = RepeatFilter(window_s=10, burst=1)
    logger.addFilter(repeat)
    for i in range(10_000):
        assert repeat.filter(_record(logger, 1000.0, f"t{i} %s"))
    assert repeat.remembered == 10_000
    assert repeat.filter(_record(logger, 1000.0, "t0 %s")) is False  # still remembered
    assert repeat.filter(_record(logger, 1000.0, "new %s"))
    assert repeat.remembered == 1  # cleared, then the new one
    assert repeat.filter(_record(logger, 1000.0, "t1 %s"))  # forgotten: passes again


def test_install_repeat_filter_adds_one_filter_once() -> None:
    logger = logging.getLogger("zns.test.install")
    try:
        first = install_repeat_filter(logger)
        assert isinstance(first, RepeatFilter) and (first.window_s, first.burst) == (10.0, 20)
        assert install_repeat_filter(logger) is first
        assert logger.filters == [first]
    finally:
        for existing in list(logger.filters):
            logger.removeFilter(existing)


def test_install_repeat_filter_finds_its_filter_among_others() -> None:
    logger = logging.getLogger("zns.test.install2")
    other = logging.Filter("x")
    logger.addFilter(other)
    try:
        first = install_repeat_filter(logger)
        assert install_repeat_filter(logger) is first
        assert logger.filters == [other, first]
    finally:
        for existing in list(logger.filters):
            logger.removeFilter(existing)


def test_a_json_line_has_the_time_in_utc_milliseconds_and_no_escapes() -> None:
    record = logging.LogRecord("zns.x", logging.WARNING, __file__, 1, "é %s", ("ü",), None)
    record.created = 1_700_000_000.1234
    line = JsonFormatter().format(record)
    assert line == ('{"time": "2023-11-14T22:13:20.123Z", "level": "WARNING", "logger": "zns.x", '
                    '"message": "é ü"}')


def test_a_json_line_carries_an_exception_once_formatted_and_a_stack() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord("zns", logging.ERROR, __file__, 1, "bug", (), None)
    record.exc_text = "Traceback: earlier"
    assert json.loads(formatter.format(record))["exception"] == "Traceback: earlier"
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("zns", logging.ERROR, __file__, 1, "bug", (), sys.exc_info())
    record.exc_text = "not this"
    data = json.loads(formatter.format(record))
    assert data["exception"].startswith("Traceback") and data["exception"].endswith("ValueError: boom")
    record = logging.LogRecord("zns", logging.INFO, __file__, 1, "here", (), None, sinfo="Stack (most recent call last):\n  x")
    data = json.loads(formatter.format(record))
    assert data["stack"] == "Stack (most recent call last):\n  x"
    assert "exception" not in data


def _configured(*args: str) -> tuple[int, logging.Handler]:
    """configure_logging(*args) on a root without handlers (pytest's own are put back):
    the root's level and the one handler it added."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    for handler in handlers:  # basicConfig adds nothing to a root that has handlers
        root.removeHandler(handler)
    try:
        configure_logging(*args)
        added, configured_level = root.handlers[:], root.level
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    (handler,) = added
    return configured_level, handler


def test_configure_logging_writes_plain_lines_to_stderr_at_the_level() -> None:
    level, handler = _configured("warning")
    assert level == logging.WARNING
    assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
    assert handler.formatter is not None and handler.formatter._fmt == PLAIN_FORMAT
    assert not isinstance(handler.formatter, JsonFormatter)
    assert PLAIN_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    # UTC, with its zone said (issue 34 item 4: local time without a zone before).
    record = logging.LogRecord("zns", logging.INFO, __file__, 1, "started", None, None)
    record.created, record.msecs = 1_800_000_000.25, 250.0
    assert handler.formatter.format(record) == "2027-01-15T08:00:00.250Z INFO zns: started"
    level, handler = _configured("info", "text")
    assert level == logging.INFO and not isinstance(handler.formatter, JsonFormatter)


def test_configure_logging_json() -> None:
    level, handler = _configured("DEBUG", "json")
    assert level == logging.DEBUG
    assert isinstance(handler.formatter, JsonFormatter)
