"""syncjobs in a real Flask app, through Flask's test client and CLI runner."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, current_app, request, session

import syncjobs
from syncjobs import DeadLetter
from syncjobs.cli import TABLE_COMMANDS
from syncjobs.contrib.flask import AppQueues, SyncJobs
from tests.flask_app import Doomed, Greet, create_app, jobs, note
from tests.helpers import WAIT
from tests.test_database import execute

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seen(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter (its exit is what a test watches), with the tests importable."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        check=False,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=60,
    )


def state(app: Any) -> AppQueues:
    found: AppQueues = app.extensions["syncjobs"]
    return found


def test_a_route_dispatches_and_the_job_runs_inside_that_apps_context(tmp_path: Path) -> None:
    # Two apps from one factory and one extension: each job sees its own app.
    shop, admin = create_app("shopfront"), create_app("backoffice")
    try:
        for app in (shop, admin):
            response = app.test_client().post("/greet", data={"out": str(tmp_path / f"{app.name}.jsonl")})
            assert response.status_code == 200
            assert len(response.json["job"]) == 36
        for app in (shop, admin):
            assert state(app).queue().join(timeout=WAIT)
            [record] = seen(tmp_path / f"{app.name}.jsonl")
            assert record == {"app": app.name, "greeting": f"hello from {app.name}", "pid": os.getpid()}
    finally:
        for app in (shop, admin):
            state(app).shutdown()


def test_a_function_task_dispatches_on_the_current_app_and_runs_in_its_context(tmp_path: Path) -> None:
    app = create_app("notes", SYNCJOBS_QUEUES=["default", "slow"])
    out = tmp_path / "notes.jsonl"
    try:
        client = app.test_client()
        assert client.post("/note", data={"out": str(out)}).status_code == 200
        assert client.post("/note", data={"out": str(out), "queue": "slow"}).status_code == 200
        for name in ("default", "slow"):
            assert state(app).queue(name).join(timeout=WAIT)
        assert seen(out) == [{"app": "notes", "text": "hi"}] * 2
        refused = r"task 'flaskapp\.note': argument 'out' is a PosixPath"
        with app.app_context(), pytest.raises(syncjobs.QueueError, match=refused):
            note.dispatch(out, text="hi")  # a Path is not JSON
    finally:
        state(app).shutdown()


def test_flask_syncjobs_worker_burst_runs_what_the_web_process_dispatched(
    database_urls: dict[str, str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    app = create_app(SYNCJOBS_URL=url)
    out = tmp_path / "seen.jsonl"
    try:
        assert app.test_client().post("/greet", data={"out": str(out)}).status_code == 200
        assert seen(out) == []  # not embedded: the web process only dispatches
        runner = app.test_cli_runner()
        result = runner.invoke(args=["syncjobs", "worker", "--burst", "--workers", "2"])
        assert result.exit_code == 0, result.output
        assert "syncjobs worker ready: pid" in result.output
        [record] = seen(out)
        assert record["app"] == "shopfront"

        result = runner.invoke(args=["syncjobs", "stats", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["queues"][0]["done_last_minute"] == 1
        result = runner.invoke(args=["syncjobs", "dead", "list"])
        assert (result.exit_code, result.output) == (0, "no dead letters\n")
    finally:
        state(app).shutdown()


def test_a_priority_given_on_the_extension_reaches_the_apps_queue(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    app = create_app(SYNCJOBS_URL=url)
    try:
        with app.app_context():
            low = jobs.dispatch(Greet(str(tmp_path / "a.jsonl")), priority=-5)
            high = note.using(priority=7).dispatch(str(tmp_path / "b.jsonl"), text="hi")
            with pytest.raises(syncjobs.QueueError, match=r"job 'flaskapp\.greet': priority must be an int"):
                jobs.dispatch(Greet(str(tmp_path / "c.jsonl")), priority=500)
        assert dict(execute(url, "SELECT id, priority FROM syncjobs_jobs")) == {str(low): -5, str(high): 7}
    finally:
        state(app).shutdown()


def test_syncjobs_timeout_is_the_default_timeout_of_the_apps_queues(tmp_path: Path) -> None:
    app = create_app(SYNCJOBS_URL=f"sqlite:///{tmp_path / 'jobs.db'}", SYNCJOBS_TIMEOUT=45)
    try:
        assert state(app).queue().timeout == 45.0
        assert [q.timeout for q in state(app).worker_queues(["a", "b"], None, None)] == [45.0, 45.0]
        assert create_app().extensions["syncjobs"].queue().timeout is None
    finally:
        state(app).shutdown()


def test_the_worker_command_refuses_memory(tmp_path: Path) -> None:
    result = create_app().test_cli_runner().invoke(args=["syncjobs", "worker", "--burst"])
    assert result.exit_code == 1
    assert "SYNCJOBS_URL is memory://" in result.output


FORKING_SERVER = textwrap.dedent(
    """
    import json, os, sys, threading
    from tests.flask_app import create_app

    app = create_app(SYNCJOBS_URL=sys.argv[1], SYNCJOBS_EMBEDDED=True, SYNCJOBS_GRACE=0.5)
    def syncjobs_threads():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("syncjobs"))

    before = syncjobs_threads()
    # As gunicorn does: the master loads the app, then forks its workers.
    pid = os.fork()
    if pid == 0:
        client = app.test_client()
        # One quick job, and one still running at exit: the grace, then handed back.
        assert client.post("/greet", data={"out": sys.argv[2]}).status_code == 200
        assert client.post("/greet", data={"out": sys.argv[2], "seconds": "120"}).status_code == 200
        queue = app.extensions["syncjobs"].queue()
        while not (os.path.exists(sys.argv[2]) and os.path.exists(sys.argv[2] + ".started")):
            queue.wait_finished(0.1)
        print(json.dumps({"child_threads": syncjobs_threads(), "pid": os.getpid()}), flush=True)
        sys.exit(0)  # a normal exit: the exit hook stops the embedded workers
    _, status = os.waitpid(pid, 0)
    after = syncjobs_threads()
    print(json.dumps({"parent_before": before, "parent_after": after, "status": status, "pid": os.getpid()}))
    """
)


def test_embedded_workers_start_after_the_fork_and_stop_with_the_grace_at_exit(tmp_path: Path) -> None:
    db, out = tmp_path / "jobs.db", tmp_path / "seen.jsonl"
    url = f"sqlite:///{db}"
    proc = run_script(FORKING_SERVER, url, str(out))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    child, parent = lines[0], lines[1]
    assert parent["status"] == 0, proc.stderr
    assert parent["parent_before"] == parent["parent_after"] == []  # the master never started a thread
    assert any(name.startswith("syncjobs-worker") for name in child["child_threads"])
    [record] = seen(out)
    assert record["app"] == "shopfront"
    assert record["pid"] == child["pid"] != parent["pid"]  # ran in the child
    # The long job was handed back at exit, its run spent.
    assert execute(url, "SELECT state, attempt FROM syncjobs_jobs") == [("queued", 1)]


DISPATCH_DURING_THE_EXIT = textwrap.dedent(
    """
    import dataclasses, sys, threading
    import syncjobs
    from syncjobs.queue import StoreQueue
    from tests.flask_app import create_app, jobs

    exit_began, running = threading.Event(), threading.Event()
    stop_claiming = StoreQueue.stop_claiming

    def observed_stop_claiming(self):  # only observes: the exit hook's shutdown has begun
        stop_claiming(self)
        exit_began.set()

    StoreQueue.stop_claiming = observed_stop_claiming

    @jobs.register
    @dataclasses.dataclass
    class Follow(syncjobs.Job):
        NAME = "follow"
        def run(self):
            pass

    @jobs.register
    @dataclasses.dataclass
    class Lead(syncjobs.Job):
        NAME = "lead"
        def run(self):
            running.set()
            assert exit_began.wait(30)
            jobs.dispatch(Follow())  # in the grace, as a job that dispatches the next step
            print("dispatched in the grace", flush=True)

    app = create_app(SYNCJOBS_URL=sys.argv[1], SYNCJOBS_EMBEDDED=True, SYNCJOBS_GRACE=5, SYNCJOBS_WORKERS=2)
    with app.app_context():
        jobs.dispatch(Lead())
    assert running.wait(30)
    # The main thread ends: the exit hook stops the workers, giving Lead its grace.
    """
)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_job_dispatching_during_the_exit_gets_its_grace_and_starts_no_workers(backend: str, tmp_path: Path) -> None:
    # The workers used to be forgotten before their grace: a dispatch then
    # started fresh ones, which the exiting interpreter refused (3.12) or
    # never stopped (3.13: a hang).
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'jobs.db'}"
    proc = run_script(DISPATCH_DURING_THE_EXIT, url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "dispatched in the grace\n", proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    # Lead finished within its grace (with memory:// too, whose own exit hook has none) ...
    assert "still running after the shutdown grace" not in proc.stderr, proc.stderr
    # ... and Follow waits for the next worker, or dies with the process.
    if backend == "memory":
        assert "exiting with 1 job(s) still pending in an in-memory queue: they are lost" in proc.stderr
    else:
        assert execute(url, "SELECT name, state, attempt FROM syncjobs_jobs") == [("follow", "queued", 0)]


def test_a_queue_named_only_at_dispatch_runs_its_jobs_in_embedded_mode(tmp_path: Path) -> None:
    app = create_app()  # memory://, SYNCJOBS_QUEUES ["default"]
    out = tmp_path / "seen.jsonl"
    try:
        with app.app_context():
            jobs.dispatch(Greet(out=str(out)), queue="reports")
        assert state(app).queue("reports").join(timeout=WAIT), "the job on 'reports' never ran"
        [record] = seen(out)
        assert record["app"] == "shopfront"
    finally:
        state(app).shutdown()


def test_dead_letter_callbacks_on_the_extension_reach_every_queue_inside_the_app_context(tmp_path: Path) -> None:
    got: list[tuple[str, str, str]] = []
    extension = SyncJobs()
    extension.register(Doomed)

    # Set on the extension before any queue exists (and reaching those built later).
    @extension.on_dead_letter
    def remember(dead: DeadLetter) -> None:
        got.append((current_app.name, dead.name, dead.error))

    def app(name: str, **config: Any) -> Flask:
        made = Flask(name)
        made.config.update(config)
        extension.init_app(made)
        return made

    embedded = app("embedded")
    with embedded.app_context():
        extension.dispatch(Doomed(reason="no such user"))
    assert state(embedded).queue().join(timeout=WAIT)
    state(embedded).shutdown()
    assert got == [("embedded", "flaskapp.doomed", "fatal: no such user")]

    # The queues `flask syncjobs worker` builds, from the same extension.
    worker_app = app("workerapp", SYNCJOBS_URL=f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        with worker_app.app_context():
            extension.dispatch(Doomed(reason="gone"))
        result = worker_app.test_cli_runner().invoke(args=["syncjobs", "worker", "--burst"])
        assert result.exit_code == 0, result.output
        assert got[1:] == [("workerapp", "flaskapp.doomed", "fatal: gone")]
    finally:
        state(worker_app).shutdown()


DEAD_LETTER_AFTER_A_FORK = textwrap.dedent(
    """
    import os, sys
    from flask import current_app
    from tests.flask_app import Doomed, create_app, jobs

    app = create_app(SYNCJOBS_URL=sys.argv[1], SYNCJOBS_EMBEDDED=True)

    @jobs.on_dead_letter
    def report(dead):
        print(f"dead in {os.getpid()} ({current_app.name}): {dead.error}", flush=True)

    app.extensions["syncjobs"].queue()  # built in the parent, before the fork
    pid = os.fork()
    if pid == 0:
        with app.app_context():
            jobs.dispatch(Doomed(reason="after the fork"))
        app.extensions["syncjobs"].queue().join(timeout=30)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print(f"child {pid} exited {status}", flush=True)
    """
)


def test_a_dead_letter_callback_survives_a_fork(tmp_path: Path) -> None:
    proc = run_script(DEAD_LETTER_AFTER_A_FORK, f"sqlite:///{tmp_path / 'jobs.db'}")
    assert proc.returncode == 0, proc.stderr
    dead, child = proc.stdout.splitlines()
    pid = child.split()[1]
    assert child == f"child {pid} exited 0"
    assert dead == f"dead in {pid} (shopfront): fatal: after the fork"


# -- the commands' own help, and the table commands on the app's SYNCJOBS_URL ---------------


def test_flask_syncjobs_help_describes_each_command() -> None:
    result = create_app().test_cli_runner().invoke(args=["syncjobs", "--help"])
    assert result.exit_code == 0, result.output
    listed = " ".join(result.output.split())
    for command, text in TABLE_COMMANDS.items():
        assert f"{command} {text}" in listed
    assert "worker run workers for the app's queues until SIGTERM or SIGINT" in listed


def test_each_command_has_its_own_help_without_options_that_do_not_apply() -> None:
    runner = create_app().test_cli_runner()
    stats = runner.invoke(args=["syncjobs", "stats", "--help"])
    assert stats.exit_code == 0, stats.output
    assert stats.output.startswith("usage: flask syncjobs stats ")
    assert "--json" in stats.output
    for absent in ("--url", "--app", "--table"):  # SYNCJOBS_URL says where the table is
        assert absent not in stats.output
    worker = runner.invoke(args=["syncjobs", "worker", "--help"])
    assert worker.exit_code == 0, worker.output
    assert worker.output.startswith("usage: flask syncjobs worker ")
    assert "APP" not in worker.output  # the `syncjobs` command's own, not here
    assert "(default: SYNCJOBS_WORKERS, 4 unless set)" in " ".join(worker.output.split())


def test_the_table_commands_work_on_the_apps_url(tmp_path: Path) -> None:
    app = create_app(SYNCJOBS_URL=f"sqlite:///{tmp_path / 'jobs.db'}")
    runner = app.test_cli_runner()
    missing = runner.invoke(args=["syncjobs", "stats"])
    assert missing.exit_code == 1
    assert missing.output.endswith(": `flask syncjobs migrate` creates it\n")
    assert not (tmp_path / "jobs.db").exists()  # a read-only command creates nothing
    assert runner.invoke(args=["syncjobs", "migrate"]).exit_code == 0
    try:
        with app.app_context():
            job_id = str(jobs.dispatch(Greet(out=str(tmp_path / "seen.jsonl")), delay=3600))
        shown = runner.invoke(args=["syncjobs", "show", job_id, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["state"] == "scheduled"
        cancelled = runner.invoke(args=["syncjobs", "cancel", job_id])
        assert cancelled.exit_code == 0, cancelled.output
        assert state(app).queue().status(job_id).state == "cancelled"  # type: ignore[union-attr]
    finally:
        state(app).shutdown()


def test_the_table_commands_refuse_memory_in_one_line() -> None:
    result = create_app().test_cli_runner().invoke(args=["syncjobs", "show", "some-id"])
    assert result.exit_code == 1
    assert result.output == (
        "flask syncjobs show: error: SYNCJOBS_URL is memory://: its jobs live inside the web process; "
        "there is no table\n"
    )


def test_the_worker_commands_options_override_the_apps_config(tmp_path: Path) -> None:
    app = create_app(SYNCJOBS_URL=f"sqlite:///{tmp_path / 'jobs.db'}", SYNCJOBS_TIMEOUT=45, SYNCJOBS_KEEP_RESULT=60)
    [queue] = state(app).worker_queues(None, None, None, timeout=5.0, keep_result=0.0)
    [configured] = state(app).worker_queues(None, None, None)
    assert (queue.timeout, queue.keep_result) == (5.0, 0.0)
    assert (configured.timeout, configured.keep_result) == (45.0, 60.0)


def test_hooks_on_the_extension_reach_every_apps_queues_inside_their_app_context(tmp_path: Path) -> None:
    extension = SyncJobs()
    extension.register(Greet)
    tagged: list[str] = []
    reports: list[tuple[str, syncjobs.Outcome, str]] = []

    @extension.around_dispatch
    def tag(job: syncjobs.Job) -> Any:
        tagged.append(job.NAME)
        return contextlib.nullcontext()

    @extension.observe_runs
    def observe(report: syncjobs.RunReport) -> None:
        reports.append((report.name, report.outcome, current_app.name))

    apps = [Flask(name) for name in ("one", "two")]
    for app in apps:
        app.config.update(SYNCJOBS_EMBEDDED=True, GREETING="hi")
        extension.init_app(app)
    out = tmp_path / "seen.jsonl"
    try:
        for app in apps:
            with app.app_context():
                extension.dispatch(Greet(out=str(out)))
        for app in apps:
            assert state(app).queue().join(WAIT)
    finally:
        for app in apps:
            state(app).shutdown()
    assert tagged == ["flaskapp.greet", "flaskapp.greet"]
    assert sorted(reports) == [
        ("flaskapp.greet", syncjobs.Outcome.DONE, "one"),
        ("flaskapp.greet", syncjobs.Outcome.DONE, "two"),
    ]


def test_a_schedule_on_the_extension_runs_on_the_queue_it_names_in_the_apps_context() -> None:
    extension = SyncJobs()
    ran: list[tuple[str, str]] = []
    beat_seen = threading.Event()

    @extension.task(name="tests.flask.beat", queue="beats", schedule=syncjobs.Schedule(every=1))
    def beat() -> None:
        ran.append(("task", current_app.name))
        beat_seen.set()

    app = Flask("scheduled")
    app.config.update(SYNCJOBS_EMBEDDED=True, SYNCJOBS_QUEUES=["default", "beats"])
    extension.init_app(app)
    try:
        with app.app_context():
            assert [s.name for s in state(app).queue("beats").schedules()] == ["tests.flask.beat"]
            assert state(app).queue("default").schedules() == []  # only the queue it names
            state(app).start()
        assert beat_seen.wait(WAIT)
    finally:
        state(app).shutdown()
    assert ran[0] == ("task", "scheduled")


# -- the web dashboard, mounted with init_dashboard --------------------------------------

#: Every URL a page of the dashboard names: links, forms, its script and stylesheet, the live part.
#: The URLs a page links to or loads (a data: URL, the empty favicon, is in the page itself: none).
URL_ATTRIBUTES = re.compile(r'\b(?:href|action|src|data-refresh)="(?!data:)([^"]*)"')


def dashboard_app(url: str, queue: str = "default") -> Flask:
    """The test app on ``url``, with a session and a route that makes its session an admin's."""
    app = create_app(SYNCJOBS_URL=url, SYNCJOBS_QUEUES=[queue], SECRET_KEY="tests-only")

    @app.post("/become-admin")
    def become_admin() -> str:
        session["admin"] = True
        return "ok"

    return app


def job_state(app: Flask, job_id: str) -> str:
    status = state(app).queue().status(job_id)
    assert status is not None
    return status.state


def dead_job(app: Flask, reason: str = "no such user") -> str:
    with app.app_context():
        job_id = str(jobs.dispatch(Doomed(reason=reason)))
    result = app.test_cli_runner().invoke(args=["syncjobs", "worker", "--burst"])
    assert result.exit_code == 0, result.output
    assert job_state(app, job_id) == "dead"
    return job_id


def csrf_field(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]*)"', page)
    assert match is not None, "no csrf field on the page"
    return match[1]


def test_init_dashboard_needs_exactly_one_way_in_and_a_database(tmp_path: Path) -> None:
    app = create_app(SYNCJOBS_URL=f"sqlite:///{tmp_path / 'jobs.db'}")
    before = app.wsgi_app
    refused: list[dict[str, Any]] = [
        {},  # never open by default
        {"token": "t", "authorize": lambda: True},
        {"token": "t", "user": "ops", "password": "pw"},
    ]
    for options in refused:
        with pytest.raises(ValueError, match="exactly one of"):
            jobs.init_dashboard(app, **options)
    with pytest.raises(ValueError, match="a user and a password together"):
        jobs.init_dashboard(app, user="ops")
    with pytest.raises(ValueError, match="a path below the app's root"):
        jobs.init_dashboard(app, "/", token="t")
    with pytest.raises(ValueError, match="SYNCJOBS_URL is memory://"):
        jobs.init_dashboard(create_app(), token="t")
    with pytest.raises(RuntimeError, match=r"call init_app\(app\) first"):
        jobs.init_dashboard(Flask("bare"), token="t")
    assert app.wsgi_app == before  # nothing mounted
    assert app.test_client().get("/jobs/").status_code == 404


def test_a_token_logs_in_under_the_prefix_and_every_url_stays_under_it(tmp_path: Path) -> None:
    app = dashboard_app(f"sqlite:///{tmp_path / 'jobs.db'}")
    jobs.init_dashboard(app, "/ops/jobs/", token="s3cret")
    try:
        job_id = dead_job(app, reason="<script>alert(1)</script>")
        client = app.test_client()
        first = client.get("/ops/jobs/")
        assert (first.status_code, first.headers["Location"]) == (303, "/ops/jobs/login?next=%2F")
        login = client.get(first.headers["Location"])
        assert login.status_code == 200
        assert 'action="/ops/jobs/login"' in login.text
        form = {"csrf": csrf_field(login.text), "next": "/", "token": "guess"}
        assert client.post("/ops/jobs/login", data=form).status_code == 401
        assert client.get("/ops/jobs/").status_code == 303  # still not in
        signed_in = client.post("/ops/jobs/login", data={**form, "token": "s3cret"})
        assert (signed_in.status_code, signed_in.headers["Location"]) == (303, "/ops/jobs/")

        overview = client.get("/ops/jobs/")
        assert overview.status_code == 200
        assert 'data-queue="default"' in overview.text
        assert f"{tmp_path / 'jobs.db'} · table syncjobs_jobs" in overview.text  # the app's own table
        job_page = client.get(f"/ops/jobs/jobs/{job_id}")
        assert "fatal: &lt;script&gt;alert(1)&lt;/script&gt;" in job_page.text
        assert "<script>alert" not in job_page.text
        urls: set[str] = set()
        for page in (overview, job_page):
            found = URL_ATTRIBUTES.findall(page.text)
            assert found
            assert [url for url in found if not url.startswith("/ops/jobs/")] == []
            urls.update(url.replace("&amp;", "&") for url in found)
        assert f"/ops/jobs/jobs/{job_id}/retry" in urls
        for url in sorted(urls - {"/ops/jobs/logout"}):  # GETs change nothing: actions are POSTs
            assert client.get(url).status_code == 200, url

        # A script's request: the token in its header, no session.
        bearer = app.test_client().get("/ops/jobs/jobs", headers={"Authorization": "Bearer s3cret"})
        assert bearer.status_code == 200
        # The app's own URLs stay the app's.
        assert client.post("/greet", data={"out": str(tmp_path / "seen.jsonl")}).status_code == 200
        assert client.get("/ops/other").status_code == 404
    finally:
        state(app).shutdown()


def test_authorize_reads_the_apps_session_inside_a_request_context_for_the_request(tmp_path: Path) -> None:
    app = dashboard_app(f"sqlite:///{tmp_path / 'jobs.db'}")
    asked: list[str] = []

    def admins_only() -> bool:
        asked.append(request.script_root + request.path)
        return bool(session.get("admin"))

    jobs.init_dashboard(app, authorize=admins_only)
    try:
        job_id = dead_job(app)
        client = app.test_client()
        refused = client.get("/jobs/")
        assert refused.status_code == 403
        assert "Forbidden" in refused.text
        assert client.get("/jobs/login").status_code == 403  # no login page of its own
        # Not an admin: a token of its own in the cookie and the form passes no CSRF check first.
        client.set_cookie("syncjobs_csrf", "made-up", path="/jobs")
        assert client.post(f"/jobs/jobs/{job_id}/retry", data={"csrf": "made-up"}).status_code == 403
        assert job_state(app, job_id) == "dead"

        assert client.post("/become-admin").status_code == 200
        allowed = client.get("/jobs/jobs", query_string={"state": "dead"})
        assert allowed.status_code == 200
        assert job_id in allowed.text
        assert asked == ["/jobs/", "/jobs/login", f"/jobs/jobs/{job_id}/retry", "/jobs/jobs"]
    finally:
        state(app).shutdown()


def test_retry_and_cancel_are_posts_with_the_dashboards_csrf_token(db_url: str, tmp_path: Path) -> None:
    name = f"dash-{uuid.uuid4().hex[:8]}"  # a queue of its own: the server's table is shared
    app = dashboard_app(db_url, queue=name)
    jobs.init_dashboard(app, authorize=lambda: session.get("admin"))
    try:
        dead = dead_job(app)
        with app.app_context():
            waiting = str(jobs.dispatch(Greet(out=str(tmp_path / "never.jsonl")), delay=3600))
        client = app.test_client()
        assert client.post("/become-admin").status_code == 200
        cases = [
            (dead, "retry", "dead", "queued", "retried"),
            (waiting, "cancel", "scheduled", "cancelled", "cancelled"),
        ]
        for job_id, action, before, after, done in cases:
            path = f"/jobs/jobs/{job_id}/{action}"
            confirm = client.get(path)
            assert confirm.status_code == 200
            assert f'action="{path}"' in confirm.text
            token = csrf_field(confirm.text)
            assert client.post(path).status_code == 403
            assert client.post(path, data={"csrf": "not-" + token}).status_code == 403
            elsewhere = {"Origin": "https://evil.example"}  # the right token, from another site's page
            assert client.post(path, data={"csrf": token}, headers=elsewhere).status_code == 403
            assert job_state(app, job_id) == before
            response = client.post(path, data={"csrf": token})
            assert (response.status_code, response.headers["Location"]) == (303, f"/jobs/jobs/{job_id}?done={done}")
            assert job_state(app, job_id) == after
    finally:
        state(app).shutdown()
        execute(db_url, "DELETE FROM syncjobs_jobs WHERE queue = ?", (name,))
