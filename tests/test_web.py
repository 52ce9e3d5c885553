"""The web dashboard through its WSGI app, on SQLite, PostgreSQL and MariaDB; ``syncjobs web`` as a process.

Every page and action as a browser uses them (cookies, the CSRF field, the
redirects), and the ways in that must stay shut: no login, a wrong one, a
form from another site, a payload that is HTML.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import syncjobs
from syncjobs.database.admin import TableAdmin
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.web import Access, Dashboard, TableBoard, dashboard, table_board
from syncjobs.web.app import LIST_LIMIT
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT, wait_until
from tests.test_database import execute
from tests.test_worker_commands import ROOT
from tests.wsgi_client import Client, Reply

pytestmark = pytest.mark.timeout(60)

TABLE = "syncjobs_web_test"
TOKEN = "s3cret-token"
#: Set to let Doomed jobs succeed: until then each is a dead letter at its first run.
HEALED = threading.Event()


@dataclasses.dataclass
class Doomed(syncjobs.Job):
    NAME = "web.doomed"
    note: str

    def run(self) -> str:
        if not HEALED.is_set():
            raise syncjobs.Fatal(f"doomed: {self.note}\nTraceback (most recent call last):\n  a second line")
        return f"healed {self.note}"


@dataclasses.dataclass
class Crashing(syncjobs.Job):
    NAME = "web.crashing"
    MAX_ATTEMPTS = 1
    note: str

    def run(self) -> None:
        raise ValueError(f"crashed on {self.note}")


@dataclasses.dataclass
class Waiting(syncjobs.Job):
    NAME = "web.waiting"
    text: str

    def run(self) -> None:
        pass


#: Set to let Gated jobs end.
GATE = threading.Event()


@dataclasses.dataclass
class Gated(syncjobs.Job):
    """One at a time per account: the limits page's example."""

    NAME = "web.gated"
    LIMIT = syncjobs.Limit("account", running=1)
    account: str

    def run(self) -> None:
        GATE.wait(WAIT)


@dataclasses.dataclass
class Table:
    """A queue of the test's own in the dashboard's table, and the dashboard on it."""

    url: str
    name: str
    queue: syncjobs.DatabaseJobQueue
    app: Dashboard
    client: Client

    def login(self) -> None:
        page = self.client.get("/login")
        assert page.status == 200
        reply = self.client.post("/login", {"token": TOKEN, "csrf": page.form_value("csrf"), "next": "/"})
        assert reply.status == 303, reply.text
        assert reply.location == "/"


def new_queue(url: str, name: str, workers: int = 0) -> syncjobs.DatabaseJobQueue:
    queue = syncjobs.DatabaseJobQueue(url, table=TABLE, queue=name, workers=workers, poll_interval=0.2)
    queue.register(Doomed)
    queue.register(Waiting)
    queue.register(Gated)
    queue.register(Crashing)
    return queue


@pytest.fixture
def table(db_url: str) -> Iterator[Table]:
    HEALED.clear()
    name = f"web-{uuid.uuid4().hex[:10]}"
    queue = new_queue(db_url, name)
    queue.install_schema()
    app = dashboard(db_url, table=TABLE, token=TOKEN)
    yield Table(db_url, name, queue, app, Client(app))
    forget(queue)
    board = app.board
    assert hasattr(board, "close")
    board.close()


def forget(queue: syncjobs.DatabaseJobQueue) -> None:
    """Delete the queue's rows, then shut it down: in that order, as a read after its shutdown opens
    connections that nothing closes."""
    queue.admin.delete_queue(queue.queue_name)
    queue.shutdown(grace=0)


def dead_job(table: Table, note: str = "x") -> str:
    """A dead letter of the table's queue: run by a worker of a queue of the same name, which then stops."""
    worker = new_queue(table.url, table.name, workers=1)
    with worker:
        job_id = worker.dispatch(Doomed(note))
        wait_until(lambda: (s := worker.status(job_id)) is not None and s.state == "dead", what="a dead letter")
    return str(job_id)


def row_counts(page: Reply, queue: str) -> dict[str, int]:
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page.text, re.S)
    assert row is not None, f"no row of queue {queue} on the overview"
    return {state: int(n) for state, n in re.findall(r'data-state="([a-z-]+)"[^>]*>(?:<a [^>]*>)?(\d+)', row[1])}


# -- getting in --------------------------------------------------------------------


def test_every_page_needs_a_login_and_a_wrong_one_is_refused(table: Table) -> None:
    client = table.client
    for path in ("/", "/jobs", "/jobs/some-id", "/schedules", "/?part=live"):
        reply = client.get(path)
        assert reply.status == 303
        assert reply.location.startswith("/login?next=")
    # A POST is refused the same way, and changes nothing.
    job_id = dead_job(table)
    reply = client.post(f"/jobs/{job_id}/retry", {})
    assert reply.status == 303
    assert reply.location.startswith("/login")
    assert table.queue.status(job_id).state == "dead"  # type: ignore[union-attr]

    login = client.get("/login?next=/jobs")
    csrf = login.form_value("csrf")
    wrong = client.post("/login", {"token": "not-it", "csrf": csrf, "next": "/jobs"})
    assert wrong.status == 401
    assert "Wrong token." in wrong.text
    assert "syncjobs_session" not in client.cookies
    no_csrf = client.post("/login", {"token": TOKEN, "next": "/jobs"})
    assert no_csrf.status == 401
    right = client.post("/login", {"token": TOKEN, "csrf": csrf, "next": "/jobs"})
    assert right.status == 303
    assert right.location == "/jobs"
    session = next(v for v in right.headers_named("Set-Cookie") if v.startswith("syncjobs_session="))
    assert "HttpOnly" in session
    assert "SameSite=Strict" in session
    assert TOKEN not in session  # the cookie is signed, it does not carry the token
    assert client.get("/jobs").status == 200


def test_a_login_never_redirects_to_another_site(table: Table) -> None:
    page = table.client.get("/login")
    for target in ("//evil.example/", "https://evil.example/", "evil"):
        reply = table.client.post("/login", {"token": TOKEN, "csrf": page.form_value("csrf"), "next": target})
        assert reply.status == 303
        assert reply.location == "/"


def test_a_forged_or_expired_session_cookie_is_no_login(table: Table) -> None:
    table.login()
    good = table.client.cookies["syncjobs_session"]
    until, _, mac = good.partition(".")
    for forged in (f"{int(until) + 10**6}.{mac}", f"{until}.{'0' * len(mac)}", "", "garbage"):
        table.client.cookies["syncjobs_session"] = forged
        assert table.client.get("/").status == 303
    # Signed with another token's key: a session of another dashboard is none here.
    other = Access(token="another").new_session()
    table.client.cookies["syncjobs_session"] = other
    assert table.client.get("/").status == 303
    expired = Access(token=TOKEN).new_session(now=0)
    table.client.cookies["syncjobs_session"] = expired
    assert table.client.get("/").status == 303


def test_logout_ends_the_session(table: Table) -> None:
    table.login()
    page = table.client.get("/")
    reply = table.client.post("/logout", {"csrf": page.form_value("csrf")})
    assert reply.status == 303
    assert reply.location == "/login"
    assert "syncjobs_session" not in table.client.cookies
    assert table.client.get("/").status == 303


def test_a_script_uses_the_token_or_password_in_a_header(table: Table) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert table.client.get("/", headers=bearer, cookies=False).status == 200
    assert table.client.get("/", headers={"Authorization": "Bearer nope"}, cookies=False).status == 303
    # A header that a browser never adds by itself needs no CSRF field.
    job_id = dead_job(table)
    reply = table.client.post(f"/jobs/{job_id}/retry", {}, headers=bearer, cookies=False)
    assert reply.status == 303
    assert reply.location.endswith("?done=retried")

    app = Dashboard(table_board(table.url, table=TABLE), Access(user="ops", password="pw:with:colons"))
    try:
        client = Client(app)
        basic = base64.b64encode(b"ops:pw:with:colons").decode()
        assert client.get("/", headers={"Authorization": f"Basic {basic}"}).status == 200
        wrong = base64.b64encode(b"ops:nope").decode()
        assert client.get("/", headers={"Authorization": f"Basic {wrong}"}).status == 303
        assert client.get("/", headers={"Authorization": "Basic !!notbase64"}).status == 303
        page = client.get("/login")
        assert 'id="user"' in page.text
        assert 'id="password"' in page.text
        refused = client.post("/login", {"user": "ops", "password": "nope", "csrf": page.form_value("csrf")})
        assert refused.status == 401
        assert (
            client.post("/login", {"user": "ops", "password": "pw:with:colons", "csrf": page.form_value("csrf")}).status
            == 303
        )
        assert client.get("/").status == 200
    finally:
        app.board.close()  # type: ignore[attr-defined]


def test_access_takes_exactly_one_way_in() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Access()
    with pytest.raises(ValueError, match="exactly one"):
        Access(token="t", open=True)
    with pytest.raises(ValueError, match="together"):
        Access(user="u")
    with pytest.raises(ValueError, match="token is empty"):
        Access(token=" ")


def test_authorize_guards_a_mounted_dashboard(table: Table) -> None:
    allowed = threading.Event()
    app = Dashboard(table_board(table.url, table=TABLE), Access(authorize=lambda environ: allowed.is_set()))
    try:
        client = Client(app, script_name="/ops/jobs")
        refused = client.get("/")
        assert refused.status == 403  # no login page of its own: the app's login guards it
        allowed.set()
        page = client.get("/")
        assert page.status == 200
        assert 'href="/ops/jobs/jobs"' in page.text
        assert 'src="/ops/jobs/static/dashboard.js"' in page.text
        assert "Log out" not in page.text
        assert client.get("/login").status == 404
    finally:
        app.board.close()  # type: ignore[attr-defined]


# -- the overview ------------------------------------------------------------------------


def test_the_overview_counts_each_queue_and_shows_throughput_and_workers(table: Table) -> None:
    table.login()
    dead = dead_job(table, "one")
    table.queue.dispatch(Waiting("a"))
    table.queue.dispatch(Waiting("b"))
    table.queue.dispatch(Waiting("later"), delay=3600)
    page = table.client.get("/")
    assert page.status == 200
    assert row_counts(page, table.name) == {"ready": 2, "scheduled": 1, "running": 0, "dead": 1, "done-last-minute": 0}
    assert 'id="live"' in page.text
    assert 'data-refresh="/?part=live"' in page.text
    assert "Purge dead…" in page.text
    assert dead  # its queue's row links to the dead jobs
    assert f'href="/jobs?queue={table.name}&amp;state=dead"' in page.text

    # Jobs done by a live worker: the throughput and the workers table show them.
    HEALED.set()
    worker = new_queue(table.url, table.name, workers=2)
    with worker:
        done = [worker.dispatch(Doomed(f"d{i}")) for i in range(5)]
        wait_until(lambda: all(worker.status(j).state == "done" for j in done), what="5 done")  # type: ignore[union-attr]
        live = table.client.get("/?part=live")
        assert live.status == 200
        assert "<html" not in live.text  # a fragment, swapped into the page
        assert row_counts(live, table.name)["done-last-minute"] >= 5
        hour = re.search(r'id="done-hour">(\d+)<', live.text)
        assert hour is not None
        assert int(hour[1]) >= 5
        assert live.text.count("<rect") == 60
        assert f'<td class="num">{os.getpid()}</td><td>{table.name}</td>' in live.text


# -- the job list -----------------------------------------------------------------------


def test_the_job_list_filters_by_state_name_and_queue_and_finds_by_id(table: Table) -> None:
    table.login()
    dead = dead_job(table)
    waiting = str(table.queue.dispatch(Waiting("w")))
    later = str(table.queue.dispatch(Waiting("l"), delay=3600))
    other = new_queue(table.url, f"{table.name}-other")
    try:
        elsewhere = str(other.dispatch(Waiting("o")))

        def listed(**query: str) -> list[str]:
            page = table.client.get("/jobs?" + "&".join(f"{k}={quote(v)}" for k, v in query.items()))
            assert page.status == 200
            return re.findall(r'<tr data-job="([^"]+)"', page.text)

        newest_first = listed(queue=table.name)  # two dispatched in one millisecond may come in either order
        assert set(newest_first[:2]) == {later, waiting}
        assert newest_first[2:] == [dead]
        assert listed(queue=table.name, state="dead") == [dead]
        assert listed(queue=table.name, state="queued") == [waiting]
        assert listed(queue=table.name, state="scheduled") == [later]
        assert listed(queue=table.name, state="done") == []
        assert listed(queue=table.name, name="web.doomed") == [dead]
        assert elsewhere in listed(name="web.waiting")
        assert elsewhere not in listed(queue=table.name)
        # A state the dashboard does not know is no filter, and no error.
        assert listed(queue=table.name, state="bogus") == newest_first

        found = table.client.get(f"/jobs?id={quote(dead)}")
        assert found.status == 303
        assert found.location == f"/jobs/{dead}"
        missing = table.client.get("/jobs?id=%3Cb%3Enope%3C%2Fb%3E")
        assert missing.status == 404
        assert "&lt;b&gt;nope&lt;/b&gt;" in missing.text
        assert "<b>nope" not in missing.text
    finally:
        forget(other)


def test_the_job_list_shows_at_most_its_limit(table: Table) -> None:
    table.login()
    table.queue.dispatch_many([Waiting(str(i)) for i in range(LIST_LIMIT + 5)])
    page = table.client.get(f"/jobs?queue={table.name}")
    assert len(re.findall(r"<tr data-job=", page.text)) == LIST_LIMIT
    assert f"The newest {LIST_LIMIT}" in page.text


# -- one job ----------------------------------------------------------------------------


def test_a_job_page_shows_payload_error_and_result_and_escapes_them(table: Table) -> None:
    table.login()
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    job_id = str(table.queue.dispatch(Waiting(hostile)))
    page = table.client.get(f"/jobs/{job_id}")
    assert page.status == 200
    assert "<script>alert" not in page.text
    assert "<img src=x" not in page.text
    assert "&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt;&lt;img src=x" in page.text  # JSON, escaped
    assert 'id="job-state">queued<' in page.text
    assert 'id="cancel"' in page.text
    assert 'id="retry"' not in page.text
    csp = page.header("Content-Security-Policy")
    assert csp is not None
    assert "default-src 'self'" in csp
    assert page.header("X-Frame-Options") == "DENY"

    dead = dead_job(table, "<b>bold</b>")
    page = table.client.get(f"/jobs/{dead}")
    assert 'id="job-state">dead<' in page.text
    assert "doomed: &lt;b&gt;bold&lt;/b&gt;\nTraceback (most recent call last):\n  a second line" in page.text
    assert 'id="retry"' in page.text
    assert 'id="cancel"' not in page.text

    assert 'class="traceback"' not in page.text  # a Fatal says why itself

    HEALED.set()
    worker = new_queue(table.url, table.name, workers=1)
    with worker:
        crashed = str(worker.dispatch(Crashing("<u>")))
        wait_until(lambda: worker.status(crashed).state == "dead", what="crashed")  # type: ignore[union-attr]
        done = str(worker.dispatch(Doomed("<i>")))
        wait_until(lambda: worker.status(done).state == "done", what="done")  # type: ignore[union-attr]
    page = table.client.get(f"/jobs/{done}")
    assert '<pre class="result">&quot;healed &lt;i&gt;&quot;</pre>' in page.text
    page = table.client.get(f"/jobs/{crashed}")
    assert "job raised ValueError: crashed on &lt;u&gt;</pre>" in page.text
    traceback = re.search(r'<pre class="traceback">(.*?)</pre>', page.text, re.S)
    assert traceback is not None
    assert traceback[1].startswith("Traceback (most recent call last):")
    assert "raise ValueError(f&quot;crashed on {self.note}&quot;)" in traceback[1]
    assert traceback[1].rstrip().endswith("ValueError: crashed on &lt;u&gt;")
    assert table.client.get("/jobs/no-such-job").status == 404


def test_the_limits_page_shows_each_key_in_use_with_its_permits(table: Table) -> None:
    table.login()
    GATE.clear()
    worker = new_queue(table.url, table.name, workers=2)
    try:
        with worker:
            first = worker.dispatch(Gated("acme"))
            wait_until(lambda: worker.status(first).state == "running", what="the first running")  # type: ignore[union-attr]
            worker.dispatch(Gated("acme"))

            def shown() -> list[tuple[str, ...]]:
                page = table.client.get("/limits")
                assert page.status == 200
                rows = re.findall(
                    r"<tr><td>([^<]*)</td><td>([^<]*)</td><td><code[^>]*>\w+</code></td>"
                    r'<td class="num">(\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td>',
                    page.text,
                )
                return [row for row in rows if row[0] == table.name]  # other tests' queues may have keys too

            wait_until(lambda: shown() == [(table.name, "web.gated", "1", "1", "1")], what="one running, one waiting")
            GATE.set()
    finally:
        GATE.set()


# -- actions ----------------------------------------------------------------------------------


def test_retry_asks_first_then_queues_the_dead_job_again(table: Table) -> None:
    table.login()
    job_id = dead_job(table)
    ask = table.client.get(f"/jobs/{job_id}/retry")
    assert ask.status == 200
    assert 'method="post"' in ask.text
    assert 'id="confirm"' in ask.text
    assert table.queue.status(job_id).state == "dead"  # type: ignore[union-attr]  # asking changes nothing

    reply = table.client.post(f"/jobs/{job_id}/retry", {"csrf": ask.form_value("csrf")})
    assert reply.status == 303
    assert reply.location == f"/jobs/{job_id}?done=retried"
    assert "Queued again" in table.client.follow(reply).text
    status = table.queue.status(job_id)
    assert status is not None
    assert status.state == "queued"
    assert status.attempts == 0

    HEALED.set()
    worker = new_queue(table.url, table.name, workers=1)
    with worker:
        wait_until(lambda: worker.status(job_id).state == "done", what="the retried job done")  # type: ignore[union-attr]
    # A job that is no dead letter is not retried.
    again = table.client.post(f"/jobs/{job_id}/retry", {"csrf": ask.form_value("csrf")})
    assert again.location.endswith("?done=not-dead")


def test_cancel_asks_first_then_cancels_a_waiting_job(table: Table) -> None:
    table.login()
    job_id = str(table.queue.dispatch(Waiting("w")))
    ask = table.client.get(f"/jobs/{job_id}/cancel")
    assert ask.status == 200
    assert "Cancel this job?" in ask.text
    reply = table.client.post(f"/jobs/{job_id}/cancel", {"csrf": ask.form_value("csrf")})
    assert reply.location == f"/jobs/{job_id}?done=cancelled"
    page = table.client.follow(reply)
    assert 'id="job-state">cancelled<' in page.text
    assert "it will not run" in page.text
    again = table.client.post(f"/jobs/{job_id}/cancel", {"csrf": ask.form_value("csrf")})
    assert again.location.endswith("?done=not-cancelled")


def test_purge_asks_first_then_deletes_only_that_queues_dead_letters(table: Table) -> None:
    table.login()
    dead = [dead_job(table, str(i)) for i in range(2)]
    waiting = str(table.queue.dispatch(Waiting("stays")))
    other = new_queue(table.url, f"{table.name}-kept", workers=1)
    try:
        with other:
            kept = str(other.dispatch(Doomed("kept")))
            wait_until(lambda: other.status(kept).state == "dead", what="a dead letter elsewhere")  # type: ignore[union-attr]
        ask = table.client.get(f"/purge?queue={table.name}")
        assert ask.status == 200
        assert "Purge 2 dead letter(s)" in ask.text
        reply = table.client.post(f"/purge?queue={table.name}", {"csrf": ask.form_value("csrf")})
        assert reply.status == 303
        assert reply.location == "/?done=purged&count=2"
        assert "2 dead letter(s) purged." in table.client.follow(reply).text
        assert all(table.queue.status(j) is None for j in dead)
        assert table.queue.status(waiting) is not None
        assert table.queue.status(kept).state == "dead"  # type: ignore[union-attr]
    finally:
        table.queue.admin.delete_queue(other.queue_name)  # on an open queue's connections: other's are shut


def test_an_action_without_the_csrf_field_or_from_another_site_changes_nothing(table: Table) -> None:
    table.login()
    job_id = dead_job(table)
    csrf = table.client.get(f"/jobs/{job_id}/retry").form_value("csrf")
    forged = [
        table.client.post(f"/jobs/{job_id}/retry", {}),  # a form of another site: it cannot know the token
        table.client.post(f"/jobs/{job_id}/retry", {"csrf": "guessed"}),
        table.client.post(f"/jobs/{job_id}/retry", {"csrf": csrf}, headers={"Origin": "https://evil.example"}),
        table.client.post(f"/purge?queue={table.name}", {}),
        table.client.post(f"/jobs/{job_id}/cancel", {}),
    ]
    assert [reply.status for reply in forged] == [403] * 5
    assert "CSRF" in forged[0].text
    assert table.queue.status(job_id).state == "dead"  # type: ignore[union-attr]
    same_origin = table.client.post(
        f"/jobs/{job_id}/retry", {"csrf": csrf}, headers={"Origin": f"http://{table.client.host}"}
    )
    assert same_origin.status == 303
    assert same_origin.location.endswith("?done=retried")


def test_reads_are_get_and_actions_are_post(table: Table) -> None:
    table.login()
    job_id = str(table.queue.dispatch(Waiting("w")))
    assert table.client.request("PUT", f"/jobs/{job_id}/cancel").status == 405
    csrf = table.client.get("/").form_value("csrf")
    assert table.client.post("/jobs", {"csrf": csrf}).status == 405
    assert table.client.get("/logout").status == 405
    assert table.client.request("DELETE", "/", form={"csrf": csrf}).status == 405
    # A body that is not an urlencoded form (multipart, JSON) is not one of its forms.
    multipart = table.client.post(
        f"/jobs/{job_id}/cancel", {"csrf": csrf}, headers={"Content-Type": "multipart/form-data; boundary=x"}
    )
    assert multipart.status == 415
    assert table.queue.status(job_id).state == "queued"  # type: ignore[union-attr]


def test_static_files_are_the_packages_own_and_nothing_else(table: Table) -> None:
    script = table.client.get("/static/dashboard.js", cookies=False)
    assert script.status == 200
    assert script.header("Content-Type") == "text/javascript; charset=utf-8"
    assert "http://" not in script.text
    assert "https://" not in script.text
    assert table.client.get("/static/dashboard.css").status == 200
    for path in ("/static/../app.py", "/static/app.py", "/static/"):
        assert table.client.get(path).status == 404


def test_a_database_that_does_not_answer_is_a_503_page_and_the_next_request_recovers(
    proxy: FaultProxy, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Dashboard(
        TableBoard(TableAdmin.connect(proxy.url(server_url), table=TABLE, timeout=1.0), "behind a proxy"),
        Access(open=True),
    )
    try:
        client = Client(app)
        assert client.get("/").status == 200
        proxy.cut()
        proxy.refuse()
        with caplog.at_level(logging.WARNING, "syncjobs.web"):
            down = client.get("/?part=live")
        assert down.status == 503
        assert "The database did not answer" in down.text
        assert any("did not answer" in r.getMessage() for r in caplog.records)
        proxy.resume()
        assert client.get("/").status == 200
    finally:
        app.board.close()  # type: ignore[attr-defined]


# -- syncjobs web ---------------------------------------------------------------------------------


def run_web(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syncjobs", "web", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_command_refuses_to_serve_without_a_login(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    syncjobs.DatabaseJobQueue(url, workers=0).install_schema()
    env = {"SYNCJOBS_WEB_TOKEN": "", "SYNCJOBS_WEB_PASSWORD": ""}
    none = run_web("--url", url, env=env)
    assert none.returncode == 1
    assert "never open by default" in none.stderr
    wide = run_web("--url", url, "--no-auth", "--host", "0.0.0.0", env=env)  # noqa: S104 - what is refused
    assert wide.returncode == 1
    assert "only on loopback" in wide.stderr
    no_password = run_web("--url", url, "--user", "ops", env=env)
    assert no_password.returncode == 1
    assert "needs a password" in no_password.stderr


def test_the_command_serves_over_http_until_sigterm(db_url: str) -> None:
    queue = new_queue(db_url, f"web-cli-{uuid.uuid4().hex[:8]}")
    job_id = str(queue.dispatch(Waiting("over http")))
    process = subprocess.Popen(
        [sys.executable, "-m", "syncjobs", "web", "--url", db_url, "--table", TABLE, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "SYNCJOBS_WEB_TOKEN": TOKEN},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)$", line.strip())
        assert match is not None, line + (process.stderr.read() if process.stderr else "")
        base = match[1]
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        request = urllib.request.Request(f"{base}jobs/{job_id}", headers=bearer)  # noqa: S310 - http, our own
        with urllib.request.urlopen(request, timeout=WAIT) as response:  # noqa: S310 - our own server
            assert response.status == 200
            assert "over http" in response.read().decode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}login?x=1", data=b"token=nope", timeout=WAIT)  # noqa: S310
        assert refused.value.code == 401
        refused.value.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        forget(queue)


# -- what a hostile page or link tries ---------------------------------------------------------------


def test_a_login_redirect_stays_on_the_dashboard_and_in_one_header(table: Table) -> None:
    page = table.client.get("/login")
    csrf = page.form_value("csrf")
    for target, expected in (
        ("/\\evil.example/", "/"),
        ("/x\r\nSet-Cookie: pwn=1", "/"),
        ("/jobs?name=é€", "/jobs?name=%C3%A9%E2%82%AC"),
    ):
        reply = table.client.post("/login", {"token": TOKEN, "csrf": csrf, "next": target})
        assert reply.status == 303
        assert reply.location == expected
        assert all("\r" not in value and "\n" not in value for _, value in reply.headers)
        assert "pwn" not in table.client.cookies
        reply.location.encode("latin-1")  # a header WSGI servers can send


def test_an_action_the_browser_says_comes_from_another_site_is_refused_whatever_it_carries(table: Table) -> None:
    table.login()
    job_id = dead_job(table)
    csrf = table.client.get(f"/jobs/{job_id}/retry").form_value("csrf")
    cross = table.client.post(f"/jobs/{job_id}/retry", {"csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status == 403
    app = Dashboard(table_board(table.url, table=TABLE), Access(user="ops", password="pw"))
    try:
        basic = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
        # Cached Basic credentials ride along with another site's form: they are no CSRF token.
        client = Client(app)
        assert client.post(f"/jobs/{job_id}/retry", {}, headers=basic, cookies=False).status == 403
        evil = {**basic, "Origin": "https://evil.example"}
        assert client.post(f"/jobs/{job_id}/retry", {}, headers=evil, cookies=False).status == 403
        assert table.queue.status(job_id).state == "dead"  # type: ignore[union-attr]
        # A token in a Bearer header, which no browser adds by itself, needs no CSRF token; but not from elsewhere.
        bearer = {"Authorization": f"Bearer {TOKEN}", "Origin": "https://evil.example"}
        assert table.client.post(f"/jobs/{job_id}/retry", {}, headers=bearer, cookies=False).status == 403
    finally:
        app.board.close()  # type: ignore[attr-defined]


def test_another_apps_malformed_cookie_on_the_host_spoils_no_login(table: Table) -> None:
    table.login()
    session = table.client.cookies["syncjobs_session"]
    # Cookies ignore ports: an app beside it on localhost may set what a strict parser rejects.
    foreign = f'prefs={{"theme":"dark"}}; ga=x y; syncjobs_session={session}'
    reply = table.client.get("/", headers={"Cookie": foreign}, cookies=False)
    assert reply.status == 200


def test_a_queue_named_with_a_slash_can_be_purged(table: Table) -> None:
    table.login()
    name = f"{table.name}/eu"
    worker = new_queue(table.url, name, workers=1)
    try:
        with worker:
            job_id = str(worker.dispatch(Doomed("x")))
            wait_until(lambda: worker.status(job_id).state == "dead", what="a dead letter")  # type: ignore[union-attr]
        overview = table.client.get("/")
        assert f'href="/purge?queue={quote(name, safe="")}"' in overview.text
        ask = table.client.get(f"/purge?queue={quote(name, safe='')}")
        assert "Purge 1 dead letter(s)" in ask.text
        reply = table.client.post(f"/purge?queue={quote(name, safe='')}", {"csrf": ask.form_value("csrf")})
        assert reply.location == "/?done=purged&count=1"
        assert table.queue.status(job_id) is None
    finally:
        table.queue.admin.delete_queue(name)  # on an open queue's connections: the worker's are shut


def test_the_overviews_counts_link_to_lists_of_the_same_jobs(table: Table) -> None:
    table.login()
    ready = [str(table.queue.dispatch(Waiting(str(i)))) for i in range(2)]
    later = str(table.queue.dispatch(Waiting("later"), delay=3600))
    page = table.client.get("/")
    counts = row_counts(page, table.name)
    assert (counts["ready"], counts["scheduled"]) == (2, 1)
    assert f'href="/jobs?queue={table.name}&amp;state=ready"' in page.text
    assert f'href="/jobs?queue={table.name}&amp;state=parked"' in page.text
    listed = {
        state: re.findall(r'<tr data-job="([^"]+)"', table.client.get(f"/jobs?queue={table.name}&state={state}").text)
        for state in ("ready", "parked")
    }
    assert sorted(listed["ready"]) == sorted(ready)
    assert listed["parked"] == [later]


def test_behind_a_proxy_it_takes_the_scheme_and_host_the_proxy_says(table: Table) -> None:
    app = Dashboard(table_board(table.url, table=TABLE), Access(token=TOKEN), behind_proxy=True)
    try:
        client = Client(app, host="127.0.0.1:8181")
        forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "jobs.example.com"}
        page = client.get("/login", headers=forwarded)
        assert all("Secure" in c for c in page.headers_named("Set-Cookie"))
        login = {"token": TOKEN, "csrf": page.form_value("csrf"), "next": "/"}
        reply = client.post("/login", login, headers={**forwarded, "Origin": "https://jobs.example.com"})
        assert reply.status == 303
        assert all("Secure" in c for c in reply.headers_named("Set-Cookie"))
    finally:
        app.board.close()  # type: ignore[attr-defined]
    # Not behind a proxy, the same headers are anyone's to send: ignored.
    page = table.client.get("/login", headers={"X-Forwarded-Proto": "https"})
    assert not any("Secure" in c for c in page.headers_named("Set-Cookie"))


def test_a_table_at_an_older_schema_version_is_refused_with_the_command_that_upgrades_it(table: Table) -> None:
    execute(table.url, f"UPDATE {TABLE}_schema SET version = 9")
    try:
        with pytest.raises(syncjobs.QueueError, match=r"needs schema version \d+ and it is at schema version 9"):
            dashboard(table.url, table=TABLE, token=TOKEN)
        refused = run_web("--url", table.url, "--table", TABLE, env={"SYNCJOBS_WEB_TOKEN": TOKEN})
        assert refused.returncode == 1
        assert "is at schema version 9" in refused.stderr
        assert "syncjobs migrate" in refused.stderr
        # A table a newer syncjobs made: migrate would not help.
        execute(table.url, f"UPDATE {TABLE}_schema SET version = {SCHEMA_VERSION + 1}")
        with pytest.raises(syncjobs.QueueError, match=r"at schema version \d+: upgrade syncjobs"):
            dashboard(table.url, table=TABLE, token=TOKEN)
    finally:
        execute(table.url, f"UPDATE {TABLE}_schema SET version = {SCHEMA_VERSION}")
