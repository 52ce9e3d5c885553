"""``manage.py syncjobs_worker``: the ``syncjobs worker`` command, with the project's settings and jobs."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from syncjobs.cli import logs, worker
from syncjobs.cli.target import CommandError as SyncJobsCommandError
from syncjobs.cli.worker import StopRequest
from syncjobs.contrib.django import reloading, worker_queues
from syncjobs.errors import QueueError

#: Where each option takes its default from: the project's settings.
_DEFAULTS = worker.OptionDefaults.from_settings(lambda key: f'SYNCJOBS["{key}"]')


class Command(BaseCommand):
    help = (
        "Run syncjobs workers for this project's queues (settings.SYNCJOBS) until SIGTERM or SIGINT: the "
        "first stops claiming and gives running jobs the grace, a second hands them back at once. Prints "
        "one 'syncjobs worker ready' line when it is taking work; exits 0 after a clean stop."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        worker.add_arguments(parser, _DEFAULTS)
        logs.add_arguments(parser)
        parser.add_argument(
            "--reload",
            action="store_true",
            help="with DEBUG on, restart when the code changes, after the grace (development only)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # syncjobs' own loggers only: the project's LOGGING keeps the rest.
        undo = logs.configure(options["log_level"], options["log_format"], logger=logging.getLogger("syncjobs"))
        try:
            if options["reload"] and settings.DEBUG:
                code = reloading.run(lambda on_ready: self._serve(options, on_ready))
            else:
                code = self._serve(options)
        finally:
            undo()
        if code:
            sys.exit(code)

    def _serve(self, options: dict[str, Any], on_ready: Callable[[StopRequest], None] | None = None) -> int:
        # Connections opened at startup (checks, settings) are not the workers'.
        connections.close_all()
        try:
            queues = worker_queues(
                options["queues"],
                workers=options["workers"],
                grace=options["grace"],
                timeout=options["timeout"],
                keep_result=options["keep_result"],
            )
            return worker.serve(
                queues,
                max_jobs=options["max_jobs"],
                burst=options["burst"],
                out=cast("TextIO", self.stdout),
                # A worker process and nothing else: a job that ignores its
                # cancel token does not keep it alive after the stop.
                exit_if_stuck=True,
                on_ready=on_ready,
                wait_for_db=options["wait_for_db"],
            )
        except (SyncJobsCommandError, ImproperlyConfigured, QueueError) as exc:
            raise CommandError(str(exc)) from exc  # one line, as `syncjobs worker` says it
