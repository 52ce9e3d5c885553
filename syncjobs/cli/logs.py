"""Logging for the ``syncjobs`` command: text for people, JSON lines for log shippers."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from collections.abc import Callable
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


def configure(
    level: str, fmt: str, stream: TextIO | None = None, logger: logging.Logger | None = None
) -> Callable[[], None]:
    """Send records at ``level`` and above to stderr, as text or JSON lines; returns an undo.

    Every logger's, or with ``logger`` only that one's (then not propagated:
    a framework's own logging keeps the rest). Commands that run inside a
    framework's process (``manage.py``, ``flask``) undo it when they end.
    """
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(colour=use_colour(stream)))
    target = logging.getLogger() if logger is None else logger
    saved = (target.handlers[:], target.level, target.propagate)

    def undo() -> None:
        target.handlers[:], target.level, target.propagate = saved

    target.handlers[:] = [handler]
    target.setLevel(level)
    if logger is not None:
        logger.propagate = False
    return undo


def add_arguments(parser: argparse.ArgumentParser, default: str = "INFO") -> None:
    """``--log-level`` and ``--log-format``, the same wherever a syncjobs command runs."""
    parser.add_argument(
        "--log-level",
        default=default,
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help=f"log this level and above to stderr (default {default}); DEBUG also shows tracebacks of errors",
    )
    parser.add_argument(
        "--log-format", default="text", choices=("text", "json"), help="text for people, json lines for log shippers"
    )


def use_colour(stream: TextIO) -> bool:
    """Colours only on a terminal, and never under NO_COLOR (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")
