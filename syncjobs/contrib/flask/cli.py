"""``flask syncjobs …``: the ``syncjobs`` commands, with the app's configuration and jobs."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

import click
from flask import current_app
from flask.cli import with_appcontext

from ...cli import logs, main, worker
from ...cli.target import CommandError

_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@click.group("syncjobs", help="Run syncjobs workers and see what the app's queue is doing.")
def syncjobs_group() -> None:
    pass


@syncjobs_group.command("worker", context_settings=_PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@with_appcontext
def worker_command(args: Sequence[str]) -> None:
    """Run workers for the app's queues until SIGTERM or SIGINT (--help for the options)."""
    parser = argparse.ArgumentParser(
        prog="flask syncjobs worker",
        description="Run workers for the app's queues (SYNCJOBS_URL) until SIGTERM or SIGINT; jobs run inside "
        "an app context of this app.",
    )
    worker.add_arguments(parser)
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
        queues = state.worker_queues(options.queues, options.workers, options.grace)
        code = worker.serve(queues, max_jobs=options.max_jobs, burst=options.burst, exit_if_stuck=True)
    except CommandError as exc:
        _fail("worker", str(exc))
    finally:
        undo()
    sys.exit(code)


def _pass_through(command: str) -> None:
    @syncjobs_group.command(command, context_settings=_PASS_THROUGH, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @with_appcontext
    def run(args: Sequence[str]) -> None:
        url = current_app.extensions["syncjobs"].url
        if url.startswith("memory:"):
            _fail(command, "SYNCJOBS_URL is memory://: there is no table to look at")
        sys.exit(main([command, *args, "--url", url]))

    run.__doc__ = f"`syncjobs {command}` on the app's SYNCJOBS_URL (--help for the options)."


for _command in ("migrate", "stats", "dead"):
    _pass_through(_command)


def _fail(command: str, message: str) -> NoReturn:
    click.echo(f"flask syncjobs {command}: error: {message}", err=True)
    sys.exit(1)
