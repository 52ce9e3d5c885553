"""The ``syncjobs`` command (also ``python -m syncjobs``): workers, schema, stats, dead letters, demo."""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence

from .. import __version__
from ..durations import parse_duration
from ..urls import redact
from . import inspect, logs, worker
from . import web as web_command
from .target import URL_VARIABLE, CommandError, TableTarget, one_line

EPILOG = f"""\
A queue is found from --url (or ${URL_VARIABLE}): sqlite:///path/jobs.db,
postgresql://user@host/db or mysql://user@host/db; or from an APP, the
'package.module:attr' path of the app's queue (or of a function returning it).
"""


#: The width argparse wraps help to on an 80-column terminal.
_HELP_WIDTH = 78


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncjobs",
        description="Background jobs for synchronous Python: run workers and see what the queue is doing.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"syncjobs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "worker",
        parents=[_target(app_positional=True), logging_options()],
        help="run workers until SIGTERM or SIGINT",
        # Wrapped here: the raw formatter (which keeps the epilog's lines) wraps nothing.
        description=textwrap.fill(
            "Take jobs from the queue and run them until told to stop. The first SIGTERM or "
            "SIGINT stops claiming and gives running jobs --grace seconds; what still runs then is "
            "cancelled and handed back to the queue. A second signal hands them back at once. Prints one "
            "'syncjobs worker ready' line when it is taking work; exits 0 after a clean stop.",
            _HELP_WIDTH,
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE and run the job classes it (or its submodules) defines; repeatable",
    )
    worker.add_arguments(run)
    worker.add_metrics_arguments(run)
    run.set_defaults(handler=worker.run)

    add_table_commands(commands, lambda: [_target(), logging_options()])

    demo = commands.add_parser(
        "demo",
        parents=[logging_options(default="WARNING")],
        help="run a few hundred mixed jobs through a real worker pool, then print the stats",
        description="Runs a few hundred jobs of several kinds (some retried, one dead-lettered) through a "
        "real worker pool with a live progress bar, on SQLite in a temporary file unless --url names a "
        "database, then prints the stats table. Ctrl-C shuts down gracefully.",
    )
    demo.add_argument("--url", help="a database (or memory://) to run on instead of a temporary SQLite file")
    demo.add_argument("--jobs", type=worker.positive_int, default=300, help="how many jobs to dispatch (default 300)")
    demo.add_argument("--workers", type=worker.positive_int, default=4, help="worker threads (default 4)")
    demo.add_argument(
        "--grace", type=worker.seconds, default=2.0, help="seconds running jobs get at shutdown (default 2)"
    )
    demo.set_defaults(handler=_demo)
    return parser


#: The commands on a jobs table, with their one-line help: every integration offers them too.
TABLE_COMMANDS = {
    "migrate": "create or upgrade the queue's tables",
    "stats": "counts by queue and state, and the live workers",
    "show": "one job's whole record: state, runs, times, progress, error, result",
    "cancel": "cancel jobs: a waiting one never runs, a running one is asked to stop",
    "dead": "list, show, retry and purge dead letters",
    "prune": "delete what workers delete as they go, for queues no worker serves",
    "schedules": "the periodic jobs' schedules: when each ran last and runs next",
    "web": "serve the web dashboard: queues, jobs, workers; retry, cancel, purge",
}


def add_table_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: Callable[[], list[argparse.ArgumentParser]],
) -> None:
    """Add the TABLE_COMMANDS to ``commands``, each subcommand with the options of ``parents()``."""

    def add(name: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=parents(), help=TABLE_COMMANDS[name], description=description)

    migrate = add(
        "migrate",
        "Create the tables, or upgrade them to this release's schema. Idempotent, and safe "
        "to run from many processes at once.",
    )
    migrate.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    migrate.set_defaults(handler=inspect.migrate)

    stats = add(
        "stats",
        "Per queue: jobs queued (ready now), running, parked (delayed or waiting to retry) "
        "and dead; how long the oldest ready job has waited; jobs done in the last minute. Then the "
        "live worker processes with their heartbeats.",
    )
    stats.add_argument("--json", action="store_true", help="one JSON object, for machines")
    stats.add_argument(
        "--watch",
        nargs="?",
        type=_interval,
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    stats.set_defaults(handler=inspect.stats)

    show = add(
        "show",
        "Print one job's record, from any queue of the table: its state (queued, scheduled, "
        "running, retrying, done, dead, cancelled), runs spent, when it was created, started and "
        "finished, its progress, and its error or result. Exits 1 if there is no record of it.",
    )
    show.add_argument("id", help="the job id")
    show.add_argument("--json", action="store_true", help="one JSON object, for machines")
    show.set_defaults(handler=inspect.show)

    cancel = add(
        "cancel",
        "Cancel jobs by id. A queued, delayed or retrying job is cancelled at once and never "
        "runs. A running one has its cancel token set by its worker's next heartbeat, and ends "
        "cancelled when its run returns (it is not retried). Exits 1 if any id names no unfinished job.",
    )
    cancel.add_argument("ids", nargs="+", metavar="ID", help="job ids to cancel")
    cancel.set_defaults(handler=inspect.cancel)

    dead = commands.add_parser(
        "dead",
        help=TABLE_COMMANDS["dead"],
        description="Dead letters are jobs that will not run again: a Fatal error, or out of attempts.",
    )
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[*parents(), _queue_filter()], help="the dead letters, oldest first")
    listing.add_argument("--limit", type=worker.positive_int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    show = actions.add_parser("show", parents=[*parents(), _queue_filter()], help="one dead letter, with its payload")
    show.add_argument("id", help="the job id")
    retry = actions.add_parser(
        "retry",
        parents=[*parents(), _queue_filter()],
        help="queue dead letters again with fresh attempts",
    )
    retry.add_argument("ids", nargs="*", metavar="ID", help="job ids to retry")
    retry.add_argument("--all", action="store_true", help="retry every dead letter (of --queue, if given)")
    purge = actions.add_parser(
        "purge",
        parents=[*parents(), _queue_filter()],
        help="delete dead letters: --all, or --older-than DURATION",
        description="Delete dead letters for good: every one (--all), or those dead at least DURATION "
        "(--older-than), of --queue if given. On a terminal it says how many and asks first.",
    )
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every dead letter (of --queue, if given)")
    which.add_argument(
        "--older-than",
        type=_duration,
        metavar="DURATION",
        help="only those dead at least this long: 90s, 15m, 12h, 7d, 2w",
    )
    purge.add_argument("-y", "--yes", action="store_true", help="do not ask first on a terminal")
    dead.set_defaults(handler=inspect.dead)

    prune = add(
        "prune",
        "Delete, for every queue of the table, what its workers delete as they go: records of done "
        "jobs past their keep_result, cancelled jobs finished at least --cancelled-older-than ago, ids of jobs "
        "finished over an hour ago, rows of workers whose heartbeat stopped, and counts of done jobs over an "
        "hour old. For a queue no worker serves any more; run it from cron. Dead letters stay: `dead purge` "
        "deletes those.",
    )
    prune.add_argument(
        "--cancelled-older-than",
        type=_duration,
        default="10m",
        metavar="DURATION",
        help="cancelled jobs finished at least this long ago: 90s, 15m, 12h, 7d (default 10m, as keep_result)",
    )
    prune.set_defaults(handler=inspect.prune)

    schedules = add(
        "schedules",
        "List every queue's periodic jobs as the workers recorded them: the schedule (a cron "
        "expression and its time zone, or an interval), the last slot dispatched and the next.",
    )
    schedules.add_argument("--json", action="store_true", help="a JSON list, for machines")
    schedules.set_defaults(handler=inspect.schedules)

    web = add(
        "web",
        "Serve the web dashboard of the jobs table: each queue's counts, throughput over the last hour and "
        "live workers, updated in place; jobs by state, name and queue; one job's payload, error and result; "
        "retry, cancel and purge. Never open by default: a token or a user and password logs in.",
    )
    web_command.add_arguments(web)
    web.set_defaults(handler=web_command.run)


def table_commands_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The TABLE_COMMANDS for an integration, whose settings name the table: no --app, --url or --table."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_table_commands(commands, lambda: [logging_options()])
    return parser


def _target(*, app_positional: bool = False) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    if app_positional:
        common.add_argument("app", nargs="?", metavar="APP", help="the app's queue: 'package.module:attr'")
    else:
        common.add_argument("--app", metavar="APP", help="the app's queue, 'package.module:attr', instead of --url")
    common.add_argument("--url", help=f"the queue's database (default: ${URL_VARIABLE})")
    common.add_argument("--table", help="the jobs table, with --url (default syncjobs_jobs)")
    return common


def _queue_filter() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--queue", help="only this queue's dead letters (default: every queue)")
    return common


def logging_options(default: str = "INFO") -> argparse.ArgumentParser:
    """--log-level and --log-format, as a parent parser."""
    common = argparse.ArgumentParser(add_help=False)
    logs.add_arguments(common, default)
    return common


def _duration(text: str) -> str:
    """A duration as typed (what messages repeat), once it reads as one."""
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _interval(text: str) -> float:
    value = worker.seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def _demo(args: argparse.Namespace) -> int:
    # Imported here, not at the top: the demo uses the CLI's stats table and
    # colours, so each importing the other at load time would be circular.
    from ..demo import run_demo  # noqa: PLC0415

    return run_demo(url=args.url, jobs=args.jobs, workers=args.workers, grace=args.grace, log_level=args.log_level)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


def run_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    *,
    target: Callable[[], TableTarget] | None = None,
) -> int:
    """Parse ``argv`` with ``parser`` and run its command: mistakes are one line on stderr and exit 1.

    ``target()``, for an integration's table commands, gives the table its
    settings name; it is asked only once the arguments parse (``--help``
    needs no database).
    """
    return execute(parser.parse_args(argv), parser.prog, target=target)


def execute(args: argparse.Namespace, prog: str, *, target: Callable[[], TableTarget] | None = None) -> int:
    """Run the command ``args`` parsed to; its errors as ``prog COMMAND: error: …``."""
    args.prog = prog
    undo = _configure_logging(args, in_framework=target is not None)
    try:
        return _execute(args, target)
    finally:
        undo()


def _configure_logging(args: argparse.Namespace, *, in_framework: bool) -> Callable[[], None]:
    if args.command == "demo":  # the demo prints warnings its own way, around its progress bar
        return lambda: None
    if not in_framework:  # the whole process is this command's, to its exit hooks
        logs.configure(args.log_level, args.log_format)
        return lambda: None
    # Inside a framework's process (flask, manage.py), syncjobs' own loggers,
    # while the command runs: the project's logging keeps the rest.
    return logs.configure(args.log_level, args.log_format, logger=logging.getLogger("syncjobs"))


def _execute(args: argparse.Namespace, target: Callable[[], TableTarget] | None) -> int:
    try:
        if target is not None:
            args.target = target()
        code: int = args.handler(args)
        sys.stdout.flush()  # here, where a reader gone away is seen, not at exit
        return code
    except BrokenPipeError as exc:
        if not _reader_gone():  # a database's or another socket's: an error like any other
            return _failed(exc, args)
        # What reads the output stopped (`| head`, `| true`): it wanted no more, and that is no error.
        # Pointing stdout at devnull keeps the interpreter's flush at exit from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + _SIGPIPE  # as a command the default SIGPIPE ended
    except CommandError as exc:
        logging.getLogger("syncjobs").debug("the command failed", exc_info=True)
        sys.stderr.write(f"{args.prog} {args.command}: error: {_hide_url_secrets(str(exc), args)}\n")
        return 1
    except Exception as exc:  # noqa: BLE001 - one clear line for any error, unless DEBUG asks for the traceback
        return _failed(exc, args)


_SIGPIPE = getattr(signal, "SIGPIPE", 13)


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (what a BrokenPipeError there means)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)  # POLLERR comes whatever is asked
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() (Windows), or no real stdout
        return False


def _failed(exc: Exception, args: argparse.Namespace) -> int:
    """One clear line for an unexpected error, unless DEBUG asks for the traceback."""
    if args.log_level == "DEBUG":
        raise exc
    message = _hide_url_secrets(one_line(exc), args)
    sys.stderr.write(f"{args.prog} {args.command}: error: {message} (--log-level DEBUG shows the traceback)\n")
    return 1


def _hide_url_secrets(message: str, args: argparse.Namespace) -> str:
    # Messages show URLs masked already; this catches a driver's message
    # that quotes what it was given.
    target: TableTarget | None = getattr(args, "target", None)
    url = target.url if target is not None else getattr(args, "url", None) or os.environ.get(URL_VARIABLE)
    return redact(message, url)
