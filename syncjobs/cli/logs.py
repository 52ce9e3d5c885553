"""Logging for the ``syncjobs`` command: text for people, JSON lines for log shippers."""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from typing import Any, TextIO

#: Extras syncjobs puts on its records, carried into JSON lines as fields.
_FIELDS = ("job_name", "job_id", "attempt", "duration", "outcome")

_COLOURS = {
    logging.DEBUG: "\033[2m",
    logging.INFO: "\033[32m",
    logging.WARNING: "\033[33m",
    logging.ERROR: "\033[31m",
    logging.CRITICAL: "\033[1;31m",
}


class TextFormatter(logging.Formatter):
    def __init__(self, colour: bool) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.colour = colour

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        text = super().formatMessage(record)
        if self.colour:
            colour = _COLOURS.get(record.levelno, "")
            text = text.replace(record.levelname, f"{colour}{record.levelname}\033[0m", 1)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, syncjobs' fields, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in _FIELDS:
            if field in record.__dict__:
                entry[field] = record.__dict__[field]
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every record at ``level`` and above to stderr, as text or JSON lines."""
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(colour=use_colour(stream)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def use_colour(stream: TextIO) -> bool:
    """Colours only on a terminal, and never under NO_COLOR (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")
