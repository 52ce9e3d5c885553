"""``manage.py syncjobs …``: the ``syncjobs`` table commands on the jobs table ``settings.SYNCJOBS`` names.

The same subcommands as ``syncjobs`` (``stats``, ``show``, ``cancel``,
``dead …``, ``prune``, ``migrate``), without ``--url``: the project's settings
say where the table is, so nobody retypes database credentials.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS

from syncjobs.cli import add_table_commands, execute, logging_options
from syncjobs.cli.target import CommandError, TableTarget
from syncjobs.contrib.django import conf

PROG = "manage.py syncjobs"


class Command(BaseCommand):
    help = (
        "See and repair the project's jobs table (settings.SYNCJOBS): stats, show, cancel, dead "
        "letters, prune, migrate. The subcommands of the `syncjobs` command, without --url."
    )
    # An operator's tool: a mistake in SYNCJOBS is its one-line error (below), not a
    # system check report; `manage.py check` reports it as syncjobs.E002.
    requires_system_checks = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        add_table_commands(commands, lambda: [logging_options()])

    def handle(self, *args: Any, **options: Any) -> None:
        code = execute(argparse.Namespace(**options), PROG, target=project_table)
        if code:
            sys.exit(code)


def project_table() -> TableTarget:
    """The table of ``settings.SYNCJOBS``, reached as the project's queues reach it."""
    try:
        config = conf.read()
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from exc
    if config.backend == "memory":
        raise CommandError(
            "settings.SYNCJOBS uses the memory backend: its jobs live inside the web process; there is no table"
        )
    if config.url:
        return TableTarget(config.url, conf.TABLE, created_by=f"`{PROG} migrate`")
    try:
        url, connect_args = conf.connection_for(config.database or DEFAULT_DB_ALIAS)
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from exc
    # With DATABASE, the app's Django migrations create the table.
    return TableTarget(url, conf.TABLE, connect_args, created_by="`manage.py migrate`")
