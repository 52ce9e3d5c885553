"""``syncjobs migrate``, ``stats`` and ``dead``: the table, as an operator sees it."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from typing import TextIO

from ..database.admin import DeadRow, ScheduleRow, Stats, TableAdmin
from ..database.dialects import SQLITE, dialect_for
from ..database.sqlite import database_file
from ..durations import human_seconds, parse_duration
from ..errors import QueueError
from ..status import JobStatus
from ..urls import mask_url
from .table import render
from .target import DEFAULT_TABLE, CommandError, TableTarget, check_reachable, database_url, load_app


def open_admin(args: argparse.Namespace, *, creates: bool = False) -> TableAdmin:
    """The table's admin; unless the command ``creates`` the tables, ``CommandError`` where there are none.

    Only ``migrate`` makes a database file or a table: a command that reads
    or changes rows says that they are missing, and how to make them.
    """
    target = table_target(args)
    url, table = target.url, target.table
    try:
        dialect = dialect_for(url)
    except QueueError as exc:
        raise CommandError(str(exc)) from exc
    missing = f"{target.created_by} creates it"
    if not creates and dialect is SQLITE and not os.path.exists(database_file(url)):
        raise CommandError(f"there is no SQLite database at {database_file(url)}: {missing}")
    check_reachable(url, target.connect_args)
    try:
        admin = TableAdmin.connect(url, table=table, connect_args=target.connect_args)
    except QueueError as exc:
        raise CommandError(str(exc)) from exc
    if not creates and admin.schema_version() is None:
        admin.close()
        raise CommandError(f"there is no table {table} in the {dialect.name} database at {mask_url(url)}: {missing}")
    return admin


def table_target(args: argparse.Namespace) -> TableTarget:
    """The table of ``args.target`` (an integration's, from its settings), else of --app or --url and --table."""
    target: TableTarget | None = getattr(args, "target", None)
    if target is not None:
        return target
    if args.app and args.url:
        raise CommandError("give an APP or --url, not both (the APP's queue knows its URL)")
    if args.app:
        queue = load_app(args.app)
        return TableTarget(
            queue.url, queue.table, queue.connect_args, created_by="`syncjobs migrate` with the same APP"
        )
    return TableTarget(
        database_url(args.url), args.table or DEFAULT_TABLE, created_by="`syncjobs migrate` with the same --url"
    )


# -- migrate -------------------------------------------------------------------------


def migrate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: a test runner may have replaced it
    admin = open_admin(args, creates=True)
    try:
        if args.sql:
            for statement in admin.ddl():
                out.write(f"{statement.strip()};\n")
            return 0
        found = admin.migrate()
        after = admin.schema_version()
    finally:
        admin.close()
    where = f"table {admin.table}"
    if found == after:
        out.write(f"{where}: already at schema version {after}, nothing to do\n")
    elif found is None:
        out.write(f"{where}: created, schema version {after}\n")
    else:
        out.write(f"{where}: upgraded from schema version {found} to {after}\n")
    return 0


# -- stats ---------------------------------------------------------------------------


def stats(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    admin = open_admin(args)
    try:
        if args.watch is None:
            print_stats(admin.stats(), args.json, out)
            return 0
        live = out.isatty()
        try:
            while True:
                snapshot = admin.stats()
                if live:
                    out.write("\033[H\033[2J")  # redraw in place
                else:
                    out.write(f"-- {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
                print_stats(snapshot, args.json, out)
                if live:
                    out.write(f"\nevery {args.watch:g}s; Ctrl-C to stop\n")
                out.flush()
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
    finally:
        admin.close()


def print_stats(snapshot: Stats, as_json: bool, out: TextIO, *, only_queue: str | None = None) -> None:
    if only_queue is not None:
        snapshot = Stats(
            [q for q in snapshot.queues if q.queue == only_queue],
            [w for w in snapshot.workers if w.queue == only_queue],
            [s for s in snapshot.schedules if s.queue == only_queue],
        )
    if as_json:
        out.write(json.dumps(snapshot.to_dict()) + "\n")
        return
    if snapshot.queues:
        rows = [
            (
                q.queue,
                q.queued,
                q.running,
                q.parked,
                q.dead,
                human_seconds(q.oldest_queued_age),
                q.done_last_minute,
            )
            for q in snapshot.queues
        ]
        out.write(
            render(
                ("QUEUE", "QUEUED", "RUNNING", "PARKED", "DEAD", "OLDEST QUEUED", "DONE LAST MIN"),
                rows,
                numeric=(1, 2, 3, 4, 5, 6),
            )
        )
    else:
        out.write("no jobs\n")
    out.write(f"\n{len(snapshot.workers)} live worker(s)\n")
    if snapshot.workers:
        workers = [
            (w.host, w.pid, w.queue, w.threads, human_seconds(w.up_seconds), f"{human_seconds(w.heartbeat_age)} ago")
            for w in snapshot.workers
        ]
        out.write(render(("HOST", "PID", "QUEUE", "THREADS", "UP", "HEARTBEAT"), workers, numeric=(1, 3)))
    if snapshot.schedules:
        out.write(f"\n{len(snapshot.schedules)} schedule(s)\n")
        print_schedules(snapshot.schedules, out)
    served = {w.queue for w in snapshot.workers}
    for q in snapshot.queues:
        if q.running and q.queue not in served:
            out.write(
                f"queue {q.queue!r}: {q.running} running with no live worker: the worker that took "
                f"{'them' if q.running > 1 else 'it'} stopped or died, and a worker of the queue takes "
                f"{'them' if q.running > 1 else 'it'} back once the lease expires\n"
            )


def print_schedules(rows: list[ScheduleRow], out: TextIO) -> None:
    table = [(s.queue, s.name, s.description, _last(s), _next(s)) for s in rows]
    out.write(render(("QUEUE", "SCHEDULE", "WHEN", "LAST RUN", "NEXT RUN"), table))


def _last(row: ScheduleRow) -> str:
    if row.last_slot is None or row.last_age is None:
        return "never"
    return f"{_when(row.last_slot)} ({human_seconds(row.last_age)} ago)"


def _next(row: ScheduleRow) -> str:
    # A slot a few seconds past is being dispatched; one long past has no worker of its queue to dispatch it.
    late = -row.next_in
    due = f"in {human_seconds(max(0.0, row.next_in))}" if late < 5 else f"due {human_seconds(late)} ago: no worker up?"
    return f"{_when(row.next_slot)} ({due})"


def schedules(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    admin = open_admin(args)
    try:
        rows = admin.schedules()
    finally:
        admin.close()
    if args.json:
        out.write(json.dumps([dataclasses.asdict(row) for row in rows]) + "\n")
    elif rows:
        print_schedules(rows, out)
    else:
        out.write("no schedules: a queue's schedules are listed once a worker of the queue has started\n")
    return 0


# -- one job ---------------------------------------------------------------------------


def show(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    admin = open_admin(args)
    try:
        status = admin.status(args.id)
    finally:
        admin.close()
    if status is None:
        raise CommandError(
            f"no job with id {args.id!r} (never dispatched, or finished longer than its keep_result ago)"
        )
    if args.json:
        out.write(json.dumps(_status_json(status)) + "\n")
        return 0
    for key, value in _status_fields(status).items():
        if value is None or key in ("payload", "result", "traceback"):
            continue
        out.write(f"{key + ':':14}{value}\n")
    if status.payload is not None:
        out.write(f"{'payload:':14}{json.dumps(status.payload)}\n")
    if status.state == "done":
        out.write(f"{'result:':14}{json.dumps(status.result)}\n")
    if status.traceback:
        out.write("traceback:\n" + "".join(f"  {line}\n" for line in status.traceback.rstrip().splitlines()))
    return 0


def _status_fields(status: JobStatus) -> dict[str, object]:
    progress = status.progress
    return {
        "id": status.id,
        "name": status.name,
        "queue": status.queue,
        "state": status.state,
        "attempts": status.attempts,
        "max_attempts": status.max_attempts,
        "created": _iso(status.created_at),
        "started": _iso(status.started_at),
        "finished": _iso(status.finished_at),
        "due": _iso(status.run_at),
        "progress": None if progress is None else str(progress),
        "error": status.error,
        "traceback": status.traceback,
        "payload": status.payload,
        "result": status.result,
    }


def _status_json(status: JobStatus) -> dict[str, object]:
    """``show --json``: the record's fields, each time as ISO-8601 UTC and as epoch seconds (see ``_times``)."""
    fields = _status_fields(status)
    times = {
        **_times("created", status.created_at),
        **_times("started", status.started_at),
        **_times("finished", status.finished_at),
        **_times("due", status.run_at),
    }
    return {**{k: v for k, v in fields.items() if k not in ("created", "started", "finished", "due")}, **times}


def _times(name: str, moment: datetime.datetime | float | None) -> dict[str, object]:
    """One time in ``--json`` output: ``<name>_at``, ISO-8601 in UTC, and ``<name>_at_epoch``, Unix seconds."""
    if moment is None:
        return {f"{name}_at": None, f"{name}_at_epoch": None}
    # Whole milliseconds first, so that the two say the same instant to the last digit.
    millis = round((moment.timestamp() if isinstance(moment, datetime.datetime) else moment) * 1000)
    utc = _EPOCH + datetime.timedelta(milliseconds=millis)
    return {f"{name}_at": utc.isoformat(timespec="milliseconds"), f"{name}_at_epoch": millis / 1000}


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _iso(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="milliseconds")


def cancel(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    admin = open_admin(args)
    missing = 0
    try:
        for job_id in args.ids:
            found = admin.cancel(job_id)
            if found == "ended":
                out.write(f"{job_id}: cancelled\n")
            elif found == "requested":
                out.write(f"{job_id}: running; its worker cancels it at its next heartbeat\n")
            else:
                missing += 1
                out.write(f"{job_id}: no such unfinished job\n")
    finally:
        admin.close()
    return 1 if missing else 0


# -- dead letters ----------------------------------------------------------------------


def dead(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    admin = open_admin(args)
    try:
        if args.action == "list":
            return _dead_list(admin, args, out)
        if args.action == "show":
            row = admin.dead_letter(args.id, queue=args.queue)
            if row is None:
                raise CommandError(f"no dead letter with id {args.id!r}")
            _dead_show(row, out)
            return 0
        if args.action == "retry":
            return _dead_retry(admin, args, out)
        return _dead_purge(admin, args, out)
    finally:
        admin.close()


def prune(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    admin = open_admin(args)
    try:
        pruned = admin.prune(cancelled_older_than=parse_duration(args.cancelled_older_than))
    finally:
        admin.close()
    out.write(
        f"pruned {pruned.records} expired record(s) of done jobs, {pruned.cancelled} cancelled job(s), "
        f"{pruned.finished_ids} id(s) of jobs finished over an hour ago, {pruned.workers} row(s) of workers gone, "
        f"{pruned.done_counts} done count(s) over an hour old and {pruned.unique_keys} unique key(s) no job holds\n"
    )
    return 0


def _dead_purge(admin: TableAdmin, args: argparse.Namespace, out: TextIO) -> int:
    older = parse_duration(args.older_than) if args.older_than else 0.0
    scope = (f" of queue {args.queue!r}" if args.queue else "") + (
        f" older than {args.older_than}" if args.older_than else ""
    )
    if not args.yes and sys.stdin is not None and sys.stdin.isatty():
        # Someone at a terminal: a purge cannot be undone, so it says what it would delete first.
        count = admin.count_dead(older_than=older, queue=args.queue)
        if count == 0:
            out.write(f"no dead letters{scope} to purge\n")
            return 0
        sys.stderr.write(f"purge {count} dead letter(s){scope} from {admin.table}? [y/N] ")
        sys.stderr.flush()
        try:
            answer = sys.stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the question is a no
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            sys.stderr.write("\nnothing purged\n" if not answer.endswith("\n") else "nothing purged\n")
            return 1
    purged = admin.purge(older_than=older, queue=args.queue)
    out.write(f"purged {purged} dead letter(s){scope}\n")
    return 0


def _dead_list(admin: TableAdmin, args: argparse.Namespace, out: TextIO) -> int:
    rows = admin.dead_letters(queue=args.queue, limit=args.limit)
    if args.json:
        for row in rows:
            out.write(json.dumps(_dead_fields(row)) + "\n")
        return 0
    if not rows:
        out.write("no dead letters\n")
        return 0
    table = [
        (row.id, row.queue, row.name, row.attempts, f"{human_seconds(row.age)} ago", _clip(row.error, 70))
        for row in rows
    ]
    out.write(render(("ID", "QUEUE", "NAME", "ATTEMPTS", "DIED", "ERROR"), table, numeric=(3,)))
    if len(rows) == args.limit:
        out.write(f"(the first {args.limit}; --limit for more)\n")
    return 0


def _dead_show(row: DeadRow, out: TextIO) -> None:
    try:
        payload = json.dumps(json.loads(row.payload), indent=2, sort_keys=True)
    except ValueError:
        payload = row.payload
    fields = _dead_fields(row)
    for key in ("id", "queue", "name", "attempts", "max_attempts"):
        out.write(f"{key + ':':14}{fields[key]}\n")
    out.write(
        f"{'created:':14}{_when(row.created_at)}\n{'died:':14}{_when(row.finished_at)} ({human_seconds(row.age)} ago)\n"
    )
    out.write(f"{'error:':14}{row.error}\n")
    if row.context:
        out.write(f"{'context:':14}{row.context}\n")
    out.write("payload:\n" + "\n".join(f"  {line}" for line in payload.splitlines()) + "\n")


def _dead_retry(admin: TableAdmin, args: argparse.Namespace, out: TextIO) -> int:
    if args.all:
        if args.ids:
            raise CommandError("give dead letter ids or --all, not both")
        count = admin.retry_all(queue=args.queue)
        out.write(f"queued {count} dead letter(s) again with fresh attempts\n")
        return 0
    if not args.ids:
        raise CommandError(
            f"name the dead letters to retry (ids from `{getattr(args, 'prog', 'syncjobs')} dead list`), or --all"
        )
    retried = set(admin.retry(args.ids, queue=args.queue))
    for job_id in args.ids:
        out.write(f"{job_id}: queued again\n" if job_id in retried else f"{job_id}: no such dead letter\n")
    return 0 if len(retried) == len(set(args.ids)) else 1


def _dead_fields(row: DeadRow) -> dict[str, object]:
    return {
        "id": row.id,
        "queue": row.queue,
        "name": row.name,
        "attempts": row.attempts,
        "max_attempts": row.max_attempts,
        "error": row.error,
        **_times("created", row.created_at),
        **_times("died", row.finished_at),
        "age": round(row.age, 3),
    }


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
