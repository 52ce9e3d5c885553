"""The dashboard's HTML: every value from the database goes through :func:`esc`.

Pages are plain server-rendered HTML (no template engine, no front-end
build); the overview's live part is a fragment the page's own script
fetches again every few seconds.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from ..database.admin import ScheduleRow, WorkerInfo
from ..durations import human_seconds
from ..limits import LimitRow
from ..status import JobStatus, QueueCounts
from .board import STATES, Overview

#: What a redirect after an action says, by the key in its ``?done=``: fixed texts, never the request's.
NOTICES = {
    "retried": "Queued again with fresh attempts.",
    "cancelled": "Cancelled: it will not run.",
    "cancel-requested": "Running: its worker cancels it at its next heartbeat.",
    "purged": "Dead letters purged.",
    "not-dead": "Not retried: the job is not a dead letter (any more).",
    "not-cancelled": "Not cancelled: the job has finished (or there is no such job).",
}


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def href(root: str, path: str, **query: object) -> str:
    """A link inside the dashboard, its query from the given values (None ones left out), escaped for an attribute."""
    given = {key: value for key, value in query.items() if value not in (None, "")}
    return esc(root + path + (f"?{urlencode(given)}" if given else ""))


def job_path(job_id: str, action: str = "") -> str:
    return f"/jobs/{quote(job_id, safe='')}" + (f"/{action}" if action else "")


def when(moment: datetime.datetime | float | None) -> str:
    if moment is None:
        return "-"
    if isinstance(moment, datetime.datetime):
        moment = moment.timestamp()
    stamp = datetime.datetime.fromtimestamp(moment, tz=datetime.timezone.utc)
    return f'<time datetime="{stamp.isoformat()}">{stamp:%Y-%m-%d %H:%M:%S} UTC</time>'


def layout(
    root: str,
    title: str,
    body: str,
    *,
    description: str,
    csrf: str | None,
    logout: bool,
    notice: str | None = None,
    nav: str = "",
    signed_in: bool = True,
) -> str:
    """A whole page; before a login (``signed_in`` false) without the menu and what the dashboard shows."""
    links = (
        ("overview", "/", "Overview"),
        ("jobs", "/jobs", "Jobs"),
        ("schedules", "/schedules", "Schedules"),
        ("limits", "/limits", "Limits"),
    )
    menu = "".join(
        f'<a href="{href(root, path)}"{" aria-current=page" if key == nav else ""}>{label}</a>'
        for key, path, label in links
        if signed_in
    )
    where = (
        f'<span class="where" title="the jobs table this dashboard shows">{esc(description)}</span>'
        if signed_in
        else ""
    )
    out = (
        f'<form method="post" action="{href(root, "/logout")}" class="logout">{_csrf_field(csrf)}'
        '<button type="submit">Log out</button></form>'
        if logout
        else ""
    )
    flash = f'<p class="notice" role="status">{esc(notice)}</p>' if notice else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · syncjobs</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{href(root, "/static/dashboard.css")}">'
        f'<script src="{href(root, "/static/dashboard.js")}" defer></script></head>'
        f'<body><header><a class="brand" href="{href(root, "/")}">syncjobs</a><nav>{menu}</nav>'
        f"{where}{out}</header>"
        f"<main>{flash}{body}</main></body></html>"
    )


def _csrf_field(csrf: str | None) -> str:
    return "" if csrf is None else f'<input type="hidden" name="csrf" value="{esc(csrf)}">'


# -- the overview ----------------------------------------------------------------


def overview(root: str, live: str, every_ms: int) -> str:
    return (
        "<h1>Overview</h1>"
        f'<div id="live" data-refresh="{href(root, "/", part="live")}" data-every="{every_ms}">{live}</div>'
    )


def live(root: str, view: Overview, now: float | None = None) -> str:
    """The overview's part that updates itself: queues, throughput, workers."""
    return (
        _queues(root, view.queues)
        + _throughput(view.done_per_minute, time.time() if now is None else now)
        + _workers(view.workers)
        + f'<p class="updated">Updated {when(time.time() if now is None else now)}</p>'
    )


_PARKED = "delayed, waiting for a retry's backoff or for a limit's permit"


def _queues(root: str, queues: Sequence[QueueCounts]) -> str:
    if not queues:
        return '<section><h2>Queues</h2><p class="empty">No jobs in any queue.</p></section>'
    rows = []
    for q in queues:
        cells = [
            ("ready", q.queued, "ready"),
            ("scheduled", q.parked, "parked"),
            ("running", q.running, "running"),
            ("dead", q.dead, "dead"),
        ]
        counts = "".join(
            f'<td class="num" data-state="{key}"><a href="{href(root, "/jobs", queue=q.queue, state=state)}">'
            f"{count}</a></td>"
            for key, count, state in cells
        )
        purge = (
            f'<a class="action danger" href="{href(root, "/purge", queue=q.queue)}">Purge dead…</a>' if q.dead else ""
        )
        rows.append(
            f'<tr data-queue="{esc(q.queue)}"><th scope="row"><a href="{href(root, "/jobs", queue=q.queue)}">'
            f'{esc(q.queue)}</a></th>{counts}<td class="num">{esc(human_seconds(q.oldest_queued_age))}</td>'
            f'<td class="num" data-state="done-last-minute">{q.done_last_minute}</td><td>{purge}</td></tr>'
        )
    return (
        '<section><h2>Queues</h2><table class="queues"><thead><tr><th>Queue</th><th class="num">Ready</th>'
        f'<th class="num" title="{_PARKED}">Scheduled</th><th class="num">Running</th><th class="num">Dead</th>'
        '<th class="num">Oldest ready</th><th class="num">Done, last minute</th><th></th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _throughput(per_minute: Sequence[int], now: float) -> str:
    """Jobs done per minute over the last hour, as an inline SVG bar chart (drawn here: no chart library)."""
    width, height, gap = 600, 120, 2
    peak = max(per_minute, default=0) or 1
    bar = width / max(len(per_minute), 1)
    first_minute = int(now // 60) - len(per_minute) + 1
    bars = []
    for index, done in enumerate(per_minute):
        tall = round(done / peak * (height - 4))
        minute = datetime.datetime.fromtimestamp((first_minute + index) * 60, tz=datetime.timezone.utc)
        bars.append(
            f'<rect x="{index * bar:.1f}" y="{height - tall}" width="{bar - gap:.1f}" height="{tall}">'
            f"<title>{minute:%H:%M} UTC: {done} done</title></rect>"
        )
    total = sum(per_minute)
    return (
        f'<section><h2>Throughput</h2><p class="chart-caption"><strong id="done-hour">{total}</strong> '
        f"done in the last hour; at most {max(per_minute, default=0)} in a minute</p>"
        f'<svg class="chart" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="jobs done per minute over the last hour">{"".join(bars)}</svg>'
        '<div class="axis"><span>an hour ago</span><span>now</span></div></section>'
    )


def _workers(workers: Sequence[WorkerInfo]) -> str:
    if not workers:
        return '<section><h2>Workers</h2><p class="empty">No live worker.</p></section>'
    rows = "".join(
        f'<tr><td>{esc(w.host)}</td><td class="num">{w.pid}</td><td>{esc(w.queue)}</td>'
        f'<td class="num">{w.threads}</td><td class="num">{esc(human_seconds(w.up_seconds))}</td>'
        f'<td class="num">{esc(human_seconds(w.heartbeat_age))} ago</td></tr>'
        for w in workers
    )
    return (
        f'<section><h2>Workers</h2><p>{len(workers)} live</p><table class="workers"><thead><tr><th>Host</th>'
        '<th class="num">PID</th><th>Queue</th><th class="num">Threads</th><th class="num">Up</th>'
        f'<th class="num">Last heartbeat</th></tr></thead><tbody>{rows}</tbody></table></section>'
    )


# -- the job list ------------------------------------------------------------------


def job_list(
    root: str,
    jobs: Sequence[JobStatus],
    *,
    state: str | None,
    name: str | None,
    queue: str | None,
    queues: Iterable[str],
    limit: int,
    missing_id: str | None = None,
) -> str:
    options = '<option value="">any state</option>' + "".join(
        f'<option value="{s}"{" selected" if s == state else ""}>{s}</option>' for s in STATES
    )
    queue_options = "".join(
        f'<option value="{esc(q)}"{" selected" if q == queue else ""}>{esc(q)}</option>' for q in sorted(set(queues))
    )
    filters = (
        f'<form class="filters" method="get" action="{href(root, "/jobs")}">'
        f'<label>State <select name="state">{options}</select></label>'
        f'<label>Name <input name="name" value="{esc(name or "")}" placeholder="any"></label>'
        f'<label>Queue <select name="queue"><option value="">any queue</option>{queue_options}</select></label>'
        '<button type="submit">Filter</button></form>'
        f'<form class="search" method="get" action="{href(root, "/jobs")}">'
        '<label>Job id <input name="id" required placeholder="the job\'s id"></label>'
        '<button type="submit">Find</button></form>'
    )
    missing = (
        f'<p class="notice error" role="alert">No job with id <code>{esc(missing_id)}</code> '
        "(never dispatched, or finished longer than its keep_result ago).</p>"
        if missing_id is not None
        else ""
    )
    if not jobs:
        table = '<p class="empty">No jobs match.</p>'
    else:
        rows = "".join(
            f'<tr data-job="{esc(job.id)}"><td><a href="{href(root, job_path(job.id))}"><code>{esc(job.id)}</code>'
            f"</a></td><td>{esc(job.name)}</td><td>{esc(job.queue or '')}</td>"
            f'<td><span class="state {esc(job.state)}">{esc(job.state)}</span></td>'
            f'<td class="num">{job.attempts}/{job.max_attempts}</td><td>{when(job.created_at)}</td>'
            f'<td class="error">{esc(_first_line(job.error))}</td></tr>'
            for job in jobs
        )
        more = f'<p class="more">The newest {limit}; filter to see others.</p>' if len(jobs) >= limit else ""
        table = (
            '<table class="jobs"><thead><tr><th>Id</th><th>Name</th><th>Queue</th><th>State</th>'
            f'<th class="num">Attempts</th><th>Created</th><th>Error</th></tr></thead><tbody>{rows}</tbody>'
            f"</table>{more}"
        )
    return f"<h1>Jobs</h1>{missing}{filters}{table}"


def _first_line(text: str | None) -> str:
    line = (text or "").partition("\n")[0]
    return line if len(line) <= 120 else line[:119] + "…"


# -- one job --------------------------------------------------------------------------


def job_page(root: str, job: JobStatus) -> str:
    progress = job.progress
    fields: list[tuple[str, str]] = [
        ("Name", esc(job.name)),
        ("Queue", esc(job.queue or "")),
        ("State", f'<span class="state {esc(job.state)}" id="job-state">{esc(job.state)}</span>'),
        ("Attempts", f"{job.attempts} of {job.max_attempts}"),
        ("Priority", str(job.priority)),
        ("Created", when(job.created_at)),
        ("Started", when(job.started_at)),
        ("Finished", when(job.finished_at)),
        ("Due", when(job.run_at)),
        ("Progress", "-" if progress is None else esc(str(progress))),
    ]
    details = "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in fields)
    actions = []
    if job.state == "dead":
        actions.append(f'<a class="action" id="retry" href="{href(root, job_path(job.id, "retry"))}">Retry…</a>')
    if not job.finished:
        actions.append(
            f'<a class="action danger" id="cancel" href="{href(root, job_path(job.id, "cancel"))}">Cancel…</a>'
        )
    blocks = [f'<section><h2>Payload</h2><pre class="payload">{esc(_pretty(job.payload))}</pre></section>']
    if job.error:
        where = f'<h3>Traceback</h3><pre class="traceback">{esc(job.traceback)}</pre>' if job.traceback else ""
        blocks.append(f'<section><h2>Error</h2><pre class="error">{esc(job.error)}</pre>{where}</section>')
    if job.state == "done":
        blocks.append(f'<section><h2>Result</h2><pre class="result">{esc(_pretty(job.result))}</pre></section>')
    return (
        f'<h1>Job <code id="job-id">{esc(job.id)}</code></h1>'
        f'<div class="actions">{"".join(actions)}</div><dl class="job">{details}</dl>{"".join(blocks)}'
    )


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def confirm(
    root: str,
    *,
    question: str,
    detail: str,
    action: str,
    button: str,
    back: str,
    csrf: str | None,
    danger: bool = False,
) -> str:
    """A page that asks before an action: its form POSTs, with the CSRF token; ``danger``: it loses something."""
    kind = "confirm danger" if danger else "confirm"
    return (
        f'<h1>{esc(question)}</h1><p>{detail}</p><form method="post" action="{href(root, action)}" class="{kind}">'
        f'{_csrf_field(csrf)}<button type="submit" id="confirm">{esc(button)}</button> '
        f'<a href="{href(root, back)}">Go back</a></form>'
    )


# -- schedules, login, errors --------------------------------------------------------------------


def schedules(rows: Sequence[ScheduleRow]) -> str:
    if not rows:
        return (
            '<h1>Schedules</h1><p class="empty">No schedules: a queue\'s schedules are listed once a worker '
            "of the queue has started.</p>"
        )
    body = "".join(
        f"<tr><td>{esc(s.queue)}</td><td>{esc(s.name)}</td><td>{esc(s.description)}</td>"
        f"<td>{'never' if s.last_slot is None else when(s.last_slot)}</td><td>{when(s.next_slot)}</td></tr>"
        for s in rows
    )
    return (
        '<h1>Schedules</h1><table class="schedules"><thead><tr><th>Queue</th><th>Schedule</th><th>When</th>'
        f"<th>Last run</th><th>Next run</th></tr></thead><tbody>{body}</tbody></table>"
    )


def limits(rows: Sequence[LimitRow]) -> str:
    if not rows:
        return (
            "<h1>Limits</h1><p class=\"empty\">No limit in use: a job class's <code>LIMIT</code> (a task's "
            "<code>limit=</code>) is listed here while jobs under it wait or run.</p>"
        )
    body = "".join(
        f'<tr><td>{esc(r.queue)}</td><td>{esc(r.job_name or "-")}</td><td><code title="{esc(r.key)}">'
        f'{esc(r.key[:12])}</code></td><td class="num">{"-" if r.running_limit is None else r.running_limit}</td>'
        f'<td class="num">{r.running}</td><td class="num">{r.waiting}</td><td class="num">{r.booked}</td></tr>'
        for r in rows
    )
    return (
        '<h1>Limits</h1><table class="limits"><thead><tr><th>Queue</th><th>Job</th><th>Key</th>'
        '<th class="num">At once</th><th class="num">Running</th><th class="num">Waiting</th>'
        f'<th class="num">Rate turns booked</th></tr></thead><tbody>{body}</tbody></table>'
        "<p class=\"more\">A key is the digest of the job's name and its limit's fields: a name is one of the "
        "jobs that hold or wait for its permits.</p>"
    )


def login(root: str, *, token: bool, csrf: str, next_path: str, failed: bool) -> str:
    fields = (
        '<label>Token <input type="password" name="token" id="token" autocomplete="current-password" required '
        "autofocus></label>"
        if token
        else '<label>User <input name="user" id="user" autocomplete="username" required autofocus></label>'
        '<label>Password <input type="password" name="password" id="password" autocomplete="current-password" '
        "required></label>"
    )
    wrong = "Wrong token." if token else "Wrong user or password."
    error = f'<p class="notice error" role="alert">{wrong}</p>' if failed else ""
    return (
        f'<h1>Log in</h1>{error}<form method="post" action="{href(root, "/login")}" class="login">'
        f'{_csrf_field(csrf)}<input type="hidden" name="next" value="{esc(next_path)}">{fields}'
        '<button type="submit" id="login">Log in</button></form>'
    )


def problem(title: str, detail: str) -> str:
    return f"<h1>{esc(title)}</h1><p>{esc(detail)}</p>"
