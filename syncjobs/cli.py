"""The ``syncjobs`` command (also ``python -m syncjobs``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from .demo import run_demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="syncjobs", description="Background jobs for synchronous Python.")
    parser.add_argument("--version", action="version", version=f"syncjobs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run a few hundred mixed jobs on the in-memory queue and print a summary",
        description="Runs a few hundred jobs of several kinds (some retried, one dead-lettered) "
        "through a real worker pool, with live progress. Ctrl-C shuts down gracefully.",
    )
    demo.add_argument("--jobs", type=_positive_int, default=300, help="how many jobs to dispatch (default 300)")
    demo.add_argument("--workers", type=_positive_int, default=4, help="worker threads (default 4)")
    demo.add_argument("--grace", type=float, default=2.0, help="seconds running jobs get at shutdown (default 2)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return run_demo(jobs=args.jobs, workers=args.workers, grace=args.grace)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse allows no other


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
