"""The web dashboard on an in-memory queue, through its WSGI app, in the queue's own process.

What a Flask or Django app that runs an ``InMemoryJobQueue`` mounts: every
page and action as a browser uses them (cookies, the CSRF field, the
redirects), the throughput the board counts itself, and the ways in that
must stay shut.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest

import syncjobs
from syncjobs.errors import QueueError
from syncjobs.status import JobStatus
from syncjobs.web import Dashboard, MemoryBoard, dashboard, memory_board, table_board
from syncjobs.web.app import LIST_LIMIT
from syncjobs.worker import Outcome, RunReport
from tests.helpers import PROBES, OnceJob, Probe, ProbeJob, wait_until
from tests.wsgi_client import Client, Reply

pytestmark = pytest.mark.timeout(60)

TOKEN = "memory-s3cret"
QUEUE = "default"  # what an in-memory queue is called: its queue_label

MakeQueue = Callable[..., syncjobs.InMemoryJobQueue]


@pytest.fixture
def make_queue() -> Iterator[MakeQueue]:
    """In-memory queues with the probe jobs registered; shut down (their blocked probes released) at the end."""
    made: list[syncjobs.InMemoryJobQueue] = []

    def make(workers: int = 0) -> syncjobs.InMemoryJobQueue:
        queue = syncjobs.InMemoryJobQueue(workers=workers, shutdown_grace=2.0)
        queue.register(ProbeJob)
        queue.register(OnceJob)
        made.append(queue)
        return queue

    probes_before = set(PROBES)
    yield make
    for probe_id in set(PROBES) - probes_before:
        PROBES[probe_id].release.set()
    for queue in made:
        queue.shutdown()


def signed_in(queue: syncjobs.InMemoryJobQueue) -> tuple[Dashboard, Client]:
    """The dashboard of ``queue`` guarded by a token, and a browser logged in to it."""
    app = dashboard(queue, token=TOKEN)
    client = Client(app)
    page = client.get("/login")
    assert page.status == 200
    reply = client.post("/login", {"token": TOKEN, "csrf": page.form_value("csrf"), "next": "/"})
    assert reply.status == 303, reply.text
    return app, client


def status(queue: syncjobs.InMemoryJobQueue, job_id: str) -> JobStatus:
    found = queue.status(job_id)
    assert found is not None, f"no record of job {job_id}"
    return found


def dead_job(queue: syncjobs.InMemoryJobQueue, probe: Probe | None = None) -> str:
    """A dead letter of ``queue`` (started): a job allowed one run, which fails for good."""
    probe = probe or Probe("fatal")
    job_id = str(queue.dispatch(OnceJob(probe.id)))
    wait_until(lambda: status(queue, job_id).state == "dead", what="a dead letter")
    return job_id


def row_counts(page: Reply, queue: str = QUEUE) -> dict[str, int]:
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page.text, re.S)
    assert row is not None, f"no row of queue {queue} on the overview"
    return {state: int(n) for state, n in re.findall(r'data-state="([a-z-]+)"[^>]*>(?:<a [^>]*>)?(\d+)', row[1])}


def done_in_hour(page: Reply) -> int:
    found = re.search(r'id="done-hour">(\d+)<', page.text)
    assert found is not None, "no throughput on the page"
    return int(found[1])


def listed(client: Client, **query: str) -> list[str]:
    page = client.get("/jobs?" + "&".join(f"{k}={quote(v)}" for k, v in query.items()))
    assert page.status == 200
    return re.findall(r'<tr data-job="([^"]+)"', page.text)


# -- choosing the board ------------------------------------------------------------------


def test_dashboard_chooses_the_memory_board_for_an_in_memory_queue(make_queue: MakeQueue) -> None:
    queue = make_queue()
    app = dashboard(queue, open=True)
    assert isinstance(app.board, MemoryBoard)
    assert app.board.description == "in memory · this process"
    assert "in memory · this process" in Client(app).get("/").text
    assert isinstance(memory_board(queue), MemoryBoard)

    with pytest.raises(QueueError, match="no table"):
        dashboard(queue, table="syncjobs_jobs", open=True)
    with pytest.raises(QueueError, match=r"memory_board\(queue\)"):
        table_board(queue)  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="InMemoryJobQueue, not int"):
        dashboard(42, open=True)  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="InMemoryJobQueue, not str"):
        memory_board("sqlite:///jobs.db")  # type: ignore[arg-type]


# -- getting in --------------------------------------------------------------------------


def test_every_page_needs_a_login_and_an_action_without_one_changes_nothing(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    with queue:
        dead = dead_job(queue)
    waiting = str(queue.dispatch(ProbeJob(Probe().id)))
    client = Client(dashboard(queue, token=TOKEN))
    for path in ("/", "/?part=live", "/jobs", f"/jobs/{dead}", f"/jobs/{dead}/retry", "/schedules"):
        reply = client.get(path)
        assert reply.status == 303, path
        assert reply.location.startswith("/login?next=")
    for path in (f"/jobs/{dead}/retry", f"/jobs/{waiting}/cancel", f"/purge?queue={QUEUE}"):
        reply = client.post(path, {})
        assert reply.status == 303
        assert reply.location.startswith("/login")
    assert status(queue, dead).state == "dead"
    assert status(queue, waiting).state == "queued"

    login = client.get("/login")
    wrong = client.post("/login", {"token": "not-it", "csrf": login.form_value("csrf"), "next": "/"})
    assert wrong.status == 401
    assert "syncjobs_session" not in client.cookies
    right = client.post("/login", {"token": TOKEN, "csrf": login.form_value("csrf"), "next": "/jobs"})
    assert right.status == 303
    assert right.location == "/jobs"
    assert client.get("/jobs").status == 200
    # A script's header: no session, no CSRF field.
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert Client(client.app).get("/", headers=bearer, cookies=False).status == 200
    assert Client(client.app).get("/", headers={"Authorization": "Bearer nope"}, cookies=False).status == 303


# -- the overview ------------------------------------------------------------------------


def test_the_overview_counts_ready_scheduled_running_and_dead(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    app, client = signed_in(queue)
    page = client.get("/")
    assert row_counts(page) == {"ready": 0, "scheduled": 0, "running": 0, "dead": 0, "done-last-minute": 0}
    assert "No live worker." in page.text  # not started
    assert "Purge dead…" not in page.text

    with queue:
        dead_job(queue)
        blocker = Probe("block")
        running = str(queue.dispatch(ProbeJob(blocker.id)))
        blocker.wait_runs(1)  # the only worker holds it: what follows waits
        followers = Probe()
        ready = [str(queue.dispatch(ProbeJob(followers.id, label=i))) for i in range(2)]
        later = str(queue.dispatch(ProbeJob(followers.id), delay=3600))

        page = client.get("/")
        assert page.status == 200
        assert row_counts(page) == {"ready": 2, "scheduled": 1, "running": 1, "dead": 1, "done-last-minute": 0}
        assert f'href="/jobs?queue={QUEUE}&amp;state=dead"' in page.text
        assert "Purge dead…" in page.text
        # The queue's own pool is its one worker: this process, as many threads as the queue has workers.
        assert "<p>1 live</p>" in page.text
        assert f'<td class="num">{os.getpid()}</td><td>{QUEUE}</td><td class="num">1</td>' in page.text
        assert '<td class="num">0.0s ago</td>' in page.text

        blocker.release.set()
        wait_until(lambda: all(status(queue, j).state == "done" for j in [running, *ready]), what="3 done")
        assert status(queue, later).state == "scheduled"

    page = client.get("/")
    assert row_counts(page)["running"] == 0
    assert row_counts(page)["scheduled"] == 1
    assert "No live worker." in page.text  # shut down
    assert isinstance(app.board, MemoryBoard)


def test_throughput_counts_the_runs_done_since_the_board_was_made(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=4)
    reported = threading.Event()
    queue.observe_runs(lambda report: reported.set())
    with queue:
        queue.dispatch(ProbeJob(Probe().id))
        # Reported to the observers there were then: the board's, added later, never hears of it.
        assert reported.wait(10), "the first run was never reported"
        _, client = signed_in(queue)
        live = client.get("/?part=live")
        assert live.status == 200
        assert "<html" not in live.text  # a fragment, swapped into the page
        assert done_in_hour(live) == 0  # done before the board was made: not counted
        assert live.text.count("<rect") == 60

        # Four workers reporting at once: every run done is counted, none twice; a failed run is not.
        probe = Probe()
        jobs = [str(queue.dispatch(ProbeJob(probe.id, label=i))) for i in range(200)]
        dead_job(queue)
        wait_until(lambda: queue.join(0.05), what="200 jobs done")
        assert all(status(queue, j).state == "done" for j in jobs)
        # The observer counts after the run's record is written: poll for the last count.
        wait_until(lambda: done_in_hour(client.get("/?part=live")) == 200, what="200 counted")
        live = client.get("/?part=live")
        assert row_counts(live)["done-last-minute"] == 200


def test_the_memory_board_counts_by_minute_over_the_last_hour(make_queue: MakeQueue) -> None:
    board = MemoryBoard(make_queue())
    done = RunReport("tests.probe", "id", 1, 1, 0.01, Outcome.DONE)
    failed = RunReport("tests.probe", "id", 1, 1, 0.01, Outcome.DEAD)
    threads = [threading.Thread(target=lambda: [board._observe(done) for _ in range(500)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    board._observe(failed)
    per_minute = board.done_per_minute()
    assert len(per_minute) == 60
    assert sum(per_minute) == 2000
    assert per_minute[-1] + per_minute[-2] == 2000  # this minute (or the last one, at a minute's turn)
    assert board.done_last_minute() == 2000
    # An hour on, the ring has forgotten them.
    assert sum(board.done_per_minute(now=time.time() + 3600)) == 0
    assert board.done_last_minute(now=time.time() + 61) == 0


# -- the job list -----------------------------------------------------------------------


def test_the_job_list_filters_by_state_name_and_queue_and_finds_by_id(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    _, client = signed_in(queue)
    with queue:
        dead = dead_job(queue)
        done = str(queue.dispatch(ProbeJob(Probe().id)))
        wait_until(lambda: status(queue, done).state == "done", what="done")
    # Shut down: what is dispatched now waits.
    waiting = str(queue.dispatch(ProbeJob(Probe().id)))
    later = str(queue.dispatch(ProbeJob(Probe().id), delay=3600))

    everything = listed(client)
    # Newest first; two dispatched in one millisecond may come in either order.
    assert set(everything[:2]) == {waiting, later}
    assert set(everything[2:]) == {done, dead}
    assert everything == queue.job_ids()
    assert listed(client, queue=QUEUE) == everything
    assert listed(client, queue="elsewhere") == []
    assert listed(client, state="dead") == [dead]
    assert listed(client, state="done") == [done]
    assert listed(client, state="queued") == [waiting]
    assert listed(client, state="scheduled") == [later]
    assert listed(client, state="running") == []
    assert listed(client, state="dead", queue=QUEUE) == [dead]
    assert listed(client, name="tests.once") == [dead]
    assert set(listed(client, name="tests.probe")) == {done, waiting, later}
    assert listed(client, name="tests.probe", state="done") == [done]
    assert listed(client, name="no.such.job") == []
    assert listed(client, state="bogus") == everything  # a state the dashboard does not know is no filter
    page = client.get("/jobs")
    assert f'<td>tests.once</td><td>{QUEUE}</td><td><span class="state dead">dead</span>' in page.text
    assert "fatal: nope" in page.text

    found = client.get(f"/jobs?id={quote(done)}")
    assert found.status == 303
    assert found.location == f"/jobs/{done}"
    missing = client.get("/jobs?id=%3Cb%3Enope%3C%2Fb%3E")
    assert missing.status == 404
    assert "&lt;b&gt;nope&lt;/b&gt;" in missing.text
    assert "<b>nope" not in missing.text


def test_the_job_list_shows_at_most_its_limit_newest_first(make_queue: MakeQueue) -> None:
    queue = make_queue()
    probe = Probe()
    ids = [str(queue.dispatch(ProbeJob(probe.id, label=i))) for i in range(LIST_LIMIT + 5)]
    assert queue.job_ids() == sorted(ids, reverse=True)
    _, client = signed_in(queue)
    page = client.get("/jobs")
    shown = re.findall(r'<tr data-job="([^"]+)"', page.text)
    assert shown == sorted(ids, reverse=True)[:LIST_LIMIT]
    assert f"The newest {LIST_LIMIT}" in page.text


# -- one job ----------------------------------------------------------------------------


def test_a_job_page_escapes_its_payload_and_error(make_queue: MakeQueue) -> None:
    queue = make_queue()
    _, client = signed_in(queue)
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    job_id = str(queue.dispatch(ProbeJob(hostile)))
    page = client.get(f"/jobs/{job_id}")
    assert page.status == 200
    assert "<script>alert" not in page.text
    assert "<img src=x" not in page.text
    assert "&lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert 'id="job-state">queued<' in page.text
    assert f"<dt>Queue</dt><dd>{QUEUE}</dd>" in page.text
    assert 'id="cancel"' in page.text
    assert 'id="retry"' not in page.text
    assert client.get("/jobs/no-such-job").status == 404

    worker = make_queue(workers=1)
    _, worker_client = signed_in(worker)
    with worker:
        dead = dead_job(worker)
    page = worker_client.get(f"/jobs/{dead}")
    assert 'id="job-state">dead<' in page.text
    assert '<pre class="error">' in page.text
    assert "fatal: nope" in page.text
    assert 'id="retry"' in page.text
    assert 'id="cancel"' not in page.text


# -- actions ------------------------------------------------------------------------------


def test_retry_asks_first_needs_the_csrf_field_then_queues_the_dead_job_again(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    _, client = signed_in(queue)
    probe = Probe("fatal")
    with queue:
        job_id = dead_job(queue, probe)
    ask = client.get(f"/jobs/{job_id}/retry")
    assert ask.status == 200
    assert "Retry this dead job?" in ask.text
    assert 'method="post"' in ask.text
    assert 'id="confirm"' in ask.text
    assert status(queue, job_id).state == "dead"  # asking changes nothing

    for forged in ({}, {"csrf": "guessed"}):
        refused = client.post(f"/jobs/{job_id}/retry", forged)
        assert refused.status == 403
        assert "CSRF" in refused.text
    assert status(queue, job_id).state == "dead"
    assert queue.counts().dead == 1

    reply = client.post(f"/jobs/{job_id}/retry", {"csrf": ask.form_value("csrf")})
    assert reply.status == 303
    assert reply.location == f"/jobs/{job_id}?done=retried"
    page = client.follow(reply)
    assert "Queued again with fresh attempts." in page.text
    assert 'id="job-state">queued<' in page.text
    again = status(queue, job_id)
    assert (again.state, again.attempts, again.error) == ("queued", 0, None)
    assert queue.counts().dead == 0
    assert queue.counts().queued == 1

    probe.actions[:] = ["ok"]
    with queue:
        wait_until(lambda: status(queue, job_id).state == "done", what="the retried job done")
    assert probe.attempts == [0, 0]  # fresh attempts, under the same id
    assert {run["id"] for run in probe.runs} == {job_id}
    # A job that is no dead letter (any more) is not retried.
    not_dead = client.post(f"/jobs/{job_id}/retry", {"csrf": ask.form_value("csrf")})
    assert not_dead.location.endswith("?done=not-dead")
    assert status(queue, job_id).state == "done"


def test_cancel_asks_first_then_cancels_a_waiting_job(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=0)
    _, client = signed_in(queue)
    probe = Probe()
    job_id = str(queue.dispatch(ProbeJob(probe.id)))
    ask = client.get(f"/jobs/{job_id}/cancel")
    assert ask.status == 200
    assert "Cancel this job?" in ask.text
    assert status(queue, job_id).state == "queued"
    assert client.post(f"/jobs/{job_id}/cancel", {}).status == 403
    assert status(queue, job_id).state == "queued"

    reply = client.post(f"/jobs/{job_id}/cancel", {"csrf": ask.form_value("csrf")})
    assert reply.status == 303
    assert reply.location == f"/jobs/{job_id}?done=cancelled"
    page = client.follow(reply)
    assert 'id="job-state">cancelled<' in page.text
    assert "it will not run" in page.text
    assert listed(client, state="cancelled") == [job_id]
    again = client.post(f"/jobs/{job_id}/cancel", {"csrf": ask.form_value("csrf")})
    assert again.location.endswith("?done=not-cancelled")
    assert probe.runs == []


def test_cancel_of_a_running_job_asks_its_worker(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    _, client = signed_in(queue)
    probe = Probe("cooperate")
    with queue:
        job_id = str(queue.dispatch(ProbeJob(probe.id)))
        probe.wait_runs(1)
        assert listed(client, state="running") == [job_id]
        csrf = client.get(f"/jobs/{job_id}/cancel").form_value("csrf")
        reply = client.post(f"/jobs/{job_id}/cancel", {"csrf": csrf})
        assert reply.location == f"/jobs/{job_id}?done=cancel-requested"
        wait_until(lambda: status(queue, job_id).state == "cancelled", what="the run cancelled")


def test_purge_asks_first_then_forgets_the_dead_letters_only(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    _, client = signed_in(queue)
    with queue:
        dead = [dead_job(queue) for _ in range(2)]
        done = str(queue.dispatch(ProbeJob(Probe().id)))
        wait_until(lambda: status(queue, done).state == "done", what="done")
    waiting = str(queue.dispatch(ProbeJob(Probe().id)))

    ask = client.get(f"/purge?queue={QUEUE}")
    assert ask.status == 200
    assert "Purge 2 dead letter(s)" in ask.text
    assert client.post(f"/purge?queue={QUEUE}", {}).status == 403
    assert all(status(queue, j).state == "dead" for j in dead)
    # Another queue's name: none of this queue's.
    other = client.post("/purge?queue=elsewhere", {"csrf": ask.form_value("csrf")})
    assert other.location == "/?done=purged&count=0"
    assert all(status(queue, j).state == "dead" for j in dead)

    reply = client.post(f"/purge?queue={QUEUE}", {"csrf": ask.form_value("csrf")})
    assert reply.status == 303
    assert reply.location == "/?done=purged&count=2"
    page = client.follow(reply)
    assert "2 dead letter(s) purged." in page.text
    assert row_counts(page)["dead"] == 0
    assert all(queue.status(j) is None for j in dead)
    assert status(queue, done).state == "done"
    assert status(queue, waiting).state == "queued"
    assert "Purge 0 dead letter(s)" in client.get(f"/purge?queue={QUEUE}").text


# -- schedules -----------------------------------------------------------------------------


def test_the_schedules_page_lists_the_queues_schedules(make_queue: MakeQueue) -> None:
    queue = make_queue()
    _, client = signed_in(queue)
    assert "No schedules" in client.get("/schedules").text
    queue.schedule("hourly <probe>", ProbeJob(Probe().id), every=3600)
    page = client.get("/schedules")
    assert page.status == 200
    row = re.search(r"<tbody><tr>(.*?)</tr>", page.text)
    assert row is not None
    assert row[1].startswith(f"<td>{QUEUE}</td><td>hourly &lt;probe&gt;</td>")
    assert "<td>never</td>" in row[1]
    board = memory_board(queue)
    [schedule] = board.schedules()
    assert (schedule.queue, schedule.name, schedule.last_slot, schedule.last_age) == (
        QUEUE,
        "hourly <probe>",
        None,
        None,
    )
    assert 0 < schedule.next_in <= 3600
    # Limits: an in-memory queue lists none (its store keeps its permits to itself).
    assert client.get("/limits").status == 200
    assert board.limits() == []


# -- the queue's own reads and actions ---------------------------------------------------------


def test_the_queue_lists_retries_and_purges_its_dead_letters(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=1)
    probe = Probe("fatal")
    with queue:
        dead = dead_job(queue, probe)
        fresh = dead_job(queue)
    waiting = str(queue.dispatch(ProbeJob(Probe().id)))
    assert queue.job_ids() == sorted([waiting, fresh, dead], reverse=True)
    assert queue.retry_dead(waiting) is False  # not a dead letter
    assert queue.retry_dead("no-such-id") is False
    assert queue.purge_dead(older_than=3600) == 0  # dead just now
    assert queue.retry_dead(dead) is True
    assert queue.retry_dead(dead) is False  # once
    assert status(queue, dead).state == "queued"
    assert queue.purge_dead() == 1  # the other one only
    assert queue.status(fresh) is None
    assert queue.job_ids() == sorted([waiting, dead], reverse=True)


def test_the_limits_page_lists_each_key_in_use_with_its_permits(make_queue: MakeQueue) -> None:
    queue = make_queue(workers=2)
    gate = threading.Event()

    @queue.task(name="web.memory.gated", limit=syncjobs.Limit("account", running=1))
    def gated(account: str) -> None:
        gate.wait(10)

    _, client = signed_in(queue)
    assert "No limit in use" in client.get("/limits").text
    queue.start()
    try:
        first = str(gated.dispatch("acme"))
        wait_until(lambda: status(queue, first).state == "running", what="the first running")
        gated.dispatch("acme")

        def shown() -> list[tuple[str, ...]]:
            page = client.get("/limits")
            assert page.status == 200
            return re.findall(
                r"<tr><td>([^<]*)</td><td>([^<]*)</td><td><code[^>]*>\w+</code></td>"
                r'<td class="num">(\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td>',
                page.text,
            )

        wait_until(lambda: shown() == [(QUEUE, "web.memory.gated", "1", "1", "1")], what="one running, one waiting")
    finally:
        gate.set()
    wait_until(lambda: queue.limits() == [], what="the key forgotten once nothing holds it")
