"""Logging for `zns serve`: plain or JSON lines, and a bound on repeated lines.

A peer can make the server log as often as it can send (a refused
registration, an unreadable message, a forbidden op, a `--peer` claiming a
restart with every `hb`). `RepeatFilter` lets at most `burst` lines (INFO and
above) with the same template through per `window_s` seconds and then says,
in one line, how many it held back. The clock is the log record's own
timestamp, so the filter reads no clock of its own.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time

WINDOW_S = 10.0
BURST = 20


class RepeatFilter(logging.Filter):
    """At most `burst` records per (logger, level, template) every `window_s` seconds (INFO+)."""

    def __init__(self, window_s: float = WINDOW_S, burst: int = BURST) -> None:
        super().__init__()
        self.window_s = window_s
        self.burst = burst
        # template key -> [window start, records let through, records suppressed]
        self._windows: dict[tuple[str, int, str], list[float]] = {}

    @property
    def remembered(self) -> int:
        """How many message templates have a window now (never over 10,000)."""
        return len(self._windows)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO or getattr(record, "zns_summary", False):
            return True
        key = (record.name, record.levelno, str(record.msg))
        window = self._windows.get(key)
        if window is None or record.created - window[0] >= self.window_s:
            if window is not None and window[2]:
                self._summarize(record, key, int(window[2]))
            if len(self._windows) >= 10_000:  # templates are few; this only bounds the dict
                self._windows.clear()
            self._windows[key] = [record.created, 1, 0]
            return True
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        return False

    def _summarize(self, record: logging.LogRecord, key: tuple[str, int, str], count: int) -> None:
        logging.getLogger(record.name).log(
            record.levelno, "%d more %s like %r were suppressed in the last %g s", count,
            "warnings" if record.levelno >= logging.WARNING else "lines", key[2][:80],
            self.window_s, extra={"zns_summary": True},
        )


def install_repeat_filter(logger: logging.Logger) -> RepeatFilter:
    """Add one RepeatFilter to `logger` (idempotent)."""
    for existing in logger.filters:
        if isinstance(existing, RepeatFilter):
            return existing
    repeat = RepeatFilter()
    logger.addFilter(repeat)
    return repeat


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception text when any).

    For log collectors that parse lines: the same records as the plain format,
    with the message already formatted, so nothing downstream needs `%` args.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        worker = getattr(record, "zns_worker", None)
        if isinstance(worker, int):  # a worker's line: its number a field, not a prefix
            line["worker"] = worker
            line["message"] = str(line["message"]).removeprefix(f"worker {worker}: ")
        audit = getattr(record, "audit", None)
        if isinstance(audit, dict):  # an audit line's fields (docs/operations.md)
            line.update(audit)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """PLAIN_FORMAT with the time in UTC, ISO 8601 with milliseconds and a `Z`, as the JSON
    format's: lines from hosts in several zones (or across a DST change) sort and compare."""

    converter = staticmethod(time.gmtime)
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at `level`, as plain lines (`text`) or JSON objects (`json`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else
                         TextFormatter(PLAIN_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
