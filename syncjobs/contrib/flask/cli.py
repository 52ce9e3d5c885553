"""``flask syncjobs …``: the ``syncjobs`` commands, with the app's configuration and jobs."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Sequence
from typing import NoReturn

import click
from flask import current_app
from flask.cli import with_appcontext

from ...cli import TABLE_COMMANDS, logs, run_command, table_commands_parser, worker
from ...cli.target import CommandError, TableTarget, one_line
from ...errors import QueueError
from ...urls import redact

_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}

#: Where ``flask syncjobs worker`` takes each default from: the app's config.
_DEFAULTS = worker.OptionDefaults.from_settings(lambda key: f"SYNCJOBS_{key}", grace="GRACE")


@click.group("syncjobs", help="Run syncjobs workers and see what the app's queue (SYNCJOBS_URL) is doing.")
def syncjobs_group() -> None:
    pass


@syncjobs_group.command(
    "worker",
    context_settings=_PASS_THROUGH,
    add_help_option=False,
    short_help="run workers for the app's queues until SIGTERM or SIGINT",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@with_appcontext
def worker_command(args: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="flask syncjobs worker",
        description=textwrap.fill(
            "Take jobs from the app's queues (SYNCJOBS_URL, SYNCJOBS_QUEUES) and run them, each inside an app "
            "context of this app, until told to stop. The first SIGTERM or SIGINT stops claiming and gives "
            "running jobs --grace seconds; what still runs then is cancelled and handed back to the queue. A "
            "second signal hands them back at once. Prints one 'syncjobs worker ready' line when it is taking "
            "work; exits 0 after a clean stop.",
            78,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_arguments(parser, _DEFAULTS)
    logs.add_arguments(parser)
    options = parser.parse_args(list(args))
    state = current_app.extensions["syncjobs"]
    if state.url.startswith("memory:"):
        _fail(
            "worker",
            "SYNCJOBS_URL is memory://: its jobs run inside the web process (embedded mode); "
            "a worker process needs a database URL",
        )
    # syncjobs' own loggers only, and only while it runs: the app's logging keeps the rest.
    undo = logs.configure(options.log_level, options.log_format, logger=logging.getLogger("syncjobs"))
    # This process is a worker now: a job's own dispatch must not start embedded workers too.
    state.embedded_allowed = False
    try:
        try:
            queues = state.worker_queues(
                options.queues,
                options.workers,
                options.grace,
                timeout=options.timeout,
                keep_result=options.keep_result,
            )
        except QueueError as exc:  # a bad setting in the app's config
            _fail("worker", redact(str(exc), state.url))
        except (ValueError, TypeError) as exc:
            _fail("worker", redact(one_line(exc), state.url))
        try:
            code = worker.serve(
                queues,
                max_jobs=options.max_jobs,
                burst=options.burst,
                exit_if_stuck=True,
                wait_for_db=options.wait_for_db,
            )
        except CommandError as exc:
            _fail("worker", redact(str(exc), state.url))
    finally:
        undo()
    sys.exit(code)


def _table_command(command: str) -> None:
    @syncjobs_group.command(
        command,
        context_settings=_PASS_THROUGH,
        add_help_option=False,
        short_help=TABLE_COMMANDS[command],
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @with_appcontext
    def run(args: Sequence[str]) -> None:
        parser = table_commands_parser("flask syncjobs", "See and repair the app's jobs table (SYNCJOBS_URL).")
        sys.exit(run_command(parser, [command, *args], target=_app_table))


def _app_table() -> TableTarget:
    url: str = current_app.extensions["syncjobs"].url
    if url.startswith("memory:"):
        raise CommandError("SYNCJOBS_URL is memory://: its jobs live inside the web process; there is no table")
    return TableTarget(url, created_by="`flask syncjobs migrate`")


for _command in TABLE_COMMANDS:
    _table_command(_command)


def _fail(command: str, message: str) -> NoReturn:
    click.echo(f"flask syncjobs {command}: error: {message}", err=True)
    sys.exit(1)
