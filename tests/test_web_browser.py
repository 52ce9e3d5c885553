"""The dashboard in a real browser: Debian's headless chromium, driven through its chromedriver by Selenium.

``syncjobs web`` runs as a process of its own on each database, as an
operator starts it; the test process dispatches and runs jobs into the same
table, and the browser logs in, watches the overview update in place, finds
a dead job, retries it and sees it done; through a fault-injecting proxy
(tests/faultproxy.py) it sees the overview say so while the dashboard does
not answer, and update again once it does. Every page visited is saved as a
screenshot under the test's ``tmp_path / "screenshots"`` (the path is printed:
``pytest -rA`` shows it).

Without chromium, chromedriver or selenium these tests skip, saying what is
missing; under CI (``CI=true``) they fail instead, as ``_reachable`` does for
a database server. Selenium Manager never runs: the driver's path is given,
so nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import syncjobs
from syncjobs.database.dialects import Connector
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT
from tests.test_worker_commands import ROOT, Worker

try:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from tests.chromium import CHROMEDRIVER, CHROMIUM, chromium
except ImportError as exc:
    SELENIUM_MISSING: str | None = f"selenium is not installed ({exc}): pip install '.[test]'"
else:
    SELENIUM_MISSING = None

pytestmark = pytest.mark.timeout(120)

TABLE = "syncjobs_web_browser"
#: How often the overview under test fetches its live part (the command's default is 2 s).
REFRESH = 0.5
#: A bound for what the browser waits on: a page, a refresh of the overview, a job a worker runs.
BROWSER_WAIT = 3 * WAIT
SCRIPT = "<script>window.__pwned = 1</script>"
MARKUP_ERROR = "the <em>printer</em> is on fire"


def _unavailable(reason: str) -> None:
    """Skip (locally) or fail (under CI) for a browser that is not there, as conftest's ``_reachable`` does."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must install it: the browser tests need chromium, chromedriver and selenium)")
    pytest.skip(reason)


def _browser_missing() -> str | None:
    if SELENIUM_MISSING is not None:
        return SELENIUM_MISSING
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (apt-get install {package})"
    return None


# -- the dashboard, as a process of its own -----------------------------------------------


@dataclasses.dataclass
class Served:
    """A ``syncjobs web`` process on ``db_url``'s table TABLE, and the queues a test made on that table."""

    origin: str
    token: str
    db_url: str
    queues: list[syncjobs.DatabaseJobQueue] = dataclasses.field(default_factory=list)

    def queue(self, what: str, *, workers: int) -> syncjobs.DatabaseJobQueue:
        """A queue of a name of its own on the table (started by the test if it has workers); shut down after it."""
        made = syncjobs.DatabaseJobQueue(
            self.db_url,
            table=TABLE,
            queue=f"web-browser-{what}-{uuid.uuid4().hex[:8]}",
            workers=workers,
            poll_interval=0.2,
        )
        self.queues.append(made)
        return made


def _delete_rows(db_url: str, queues: list[str]) -> None:
    """The test's own rows out of the table (a server's tables outlive the run): jobs, results, counts, workers."""
    if not queues:
        return
    connector = Connector(db_url)
    marks = ", ".join([connector.dialect.placeholder] * len(queues))
    conn = connector.connect()
    try:
        cursor = conn.cursor()
        for suffix in ("", "_results", "_done", "_workers"):
            cursor.execute(f"DELETE FROM {TABLE}{suffix} WHERE queue IN ({marks})", tuple(queues))
        cursor.close()
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def _browser_ready() -> None:
    """Skip (or fail, under CI) before anything starts when there is no browser to drive."""
    missing = _browser_missing()
    if missing is not None:
        _unavailable(missing)


@pytest.fixture
def dashboard(_browser_ready: None, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """``syncjobs web`` on ``db_url`` (any free port, the token from the environment); SIGTERM stops it: exit 0."""
    # The command shows a table, it never makes one: as `syncjobs migrate` would.
    maker = syncjobs.DatabaseJobQueue(db_url, table=TABLE, workers=0)
    try:
        maker.install_schema()
    finally:
        maker.shutdown(grace=0)
    token = secrets.token_urlsafe(16)
    monkeypatch.setenv("SYNCJOBS_WEB_TOKEN", token)  # out of `ps`, as an operator would give it
    argv = [sys.executable, "-m", "syncjobs", "web", "--url", db_url, "--table", TABLE, "--port", "0"]
    server = Worker([*argv, "--refresh", str(REFRESH)], ROOT)
    served: Served | None = None
    try:
        found = server.expect(r"^syncjobs web: serving the dashboard of .* at (http://127\.0\.0\.1:\d+)/$")
        served = Served(found[1], token, db_url)
        yield served
        for queue in served.queues:
            queue.shutdown(grace=0)
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait() == 0, "".join(server.err)
    finally:
        server.kill()  # only if it is still there
        if served is not None:
            for queue in served.queues:
                queue.shutdown(grace=0)  # again, harmless: in case the test failed before the first
            _delete_rows(db_url, [queue.queue_name for queue in served.queues])


@pytest.fixture
def dashboard_proxy(dashboard: Served) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the dashboard: a browser sent through it sees the faults it makes."""
    port = urlsplit(dashboard.origin).port
    assert port is not None, dashboard.origin
    with FaultProxy("127.0.0.1", port) as proxy:
        yield proxy


# -- the browser ----------------------------------------------------------------------------


class Shots:
    """Screenshots of the pages a test visits, numbered in order, in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.taken: list[Path] = []

    def take(self, driver: WebDriver, what: str) -> None:
        path = self.directory / f"{len(self.taken) + 1:02d}-{what}.png"
        assert driver.save_screenshot(str(path)), f"no screenshot of {what}"
        self.taken.append(path)


@pytest.fixture
def shots(tmp_path: Path) -> Shots:
    directory = tmp_path / "screenshots"
    directory.mkdir()
    print(f"screenshots of the pages visited: {directory}")  # noqa: T201 - for `pytest -rA`
    return Shots(directory)


@pytest.fixture
def browser(dashboard: Served, tmp_path: Path) -> Iterator[WebDriver]:
    """Headless chromium on a fresh profile, through Debian's chromedriver; quit before the dashboard stops."""
    # Tall enough that a job page's error and result are in its screenshot.
    with chromium(tmp_path / "chromium-profile", "--window-size=1280,1400", console=True) as driver:
        driver.set_page_load_timeout(BROWSER_WAIT)
        yield driver


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], Any], what: str, *, navigates: bool = False) -> Any:
    """Poll ``condition`` until it holds, for BROWSER_WAIT at most; one that ``navigates`` may fail between pages."""
    ignored = (WebDriverException,) if navigates else ()
    wait = WebDriverWait(driver, BROWSER_WAIT, poll_frequency=0.1, ignored_exceptions=ignored)
    return wait.until(condition, f"timed out waiting for {what}")


def click_through(driver: WebDriver, element: WebElement, what: str) -> None:
    """Click a link or a submit button and wait until the page it leads to has loaded.

    The old page is marked before the click: the new one is the page without
    the mark. (Waiting for the clicked element to go stale instead races the
    navigation: chromedriver may then fail with "Node with given id does not
    belong to the document", which is no StaleElementReferenceException.)
    While the browser is between pages, a look may fail: it is looked at again.
    """
    driver.execute_script("window.__leaving = 1")
    element.click()
    wait_for(
        driver,
        lambda d: d.execute_script("return window.__leaving === undefined && document.readyState === 'complete'"),
        f"the page after {what}",
        navigates=True,
    )


def at(driver: WebDriver, served: Served) -> str:
    """The path and query of the page the browser shows, checked to be on the dashboard."""
    url: str = driver.current_url
    assert url.startswith(served.origin + "/"), url
    return url.removeprefix(served.origin)


def assert_same_origin(driver: WebDriver, served: Served) -> None:
    """Everything the page loaded or links its resources from is the dashboard's own: no CDN, no font service."""
    urls: list[str] = driver.execute_script(
        """
        var urls = performance.getEntriesByType("resource").map(function (e) { return e.name; });
        document.querySelectorAll("script[src], img[src], iframe[src]").forEach(function (e) { urls.push(e.src); });
        document.querySelectorAll("link[href]").forEach(function (e) { urls.push(e.href); });
        return urls;
        """
    )
    assert any(url.endswith("/static/dashboard.css") for url in urls), urls  # the page did load its own
    # A data: URL (the empty favicon) is in the page itself: nothing is fetched for it.
    foreign = [url for url in urls if not url.startswith((served.origin + "/", "data:"))]
    assert not foreign, f"loaded from elsewhere: {foreign}"


def assert_console_clean(driver: WebDriver) -> None:
    """No script error, no Content-Security-Policy violation, no failed load on the pages since the last look.

    Left out: the refused login's 401, and the browser's own request of /favicon.ico (the dashboard has none).
    """
    expected = ("/favicon.ico - ", "/login - Failed to load resource: the server responded with a status of 401")
    entries = [
        entry
        for entry in driver.get_log("browser")
        if entry.get("level") in ("SEVERE", "WARNING") and not any(e in entry.get("message", "") for e in expected)
    ]
    assert not entries, entries


def log_in(driver: WebDriver, served: Served, shots: Shots | None = None) -> None:
    """Open the dashboard, which sends the browser to its login; log in with the token; land on the overview."""
    driver.get(served.origin + "/")
    assert at(driver, served) == "/login?next=%2F"
    field = driver.find_element(By.ID, "token")
    field.send_keys(served.token)
    click_through(driver, driver.find_element(By.ID, "login"), "the login")
    assert at(driver, served) == "/"
    assert driver.title == "Overview · syncjobs"
    if shots is not None:
        shots.take(driver, "overview")


def ready_count(driver: WebDriver, queue: str) -> str | None:
    """The overview's ready count of ``queue``, read afresh (the live part is replaced at each refresh)."""
    found: str | None = driver.execute_script(
        "var name = arguments[0];"
        "var row = Array.from(document.querySelectorAll('#live tr[data-queue]'))"
        "  .find(function (r) { return r.getAttribute('data-queue') === name; });"
        "var cell = row && row.querySelector('td[data-state=ready]');"
        "return cell ? cell.textContent.trim() : null;",
        queue,
    )
    return found


def stale(driver: WebDriver) -> bool:
    """Whether the overview marks its live part stale, and shows the notice that says so."""
    notice: str | None = driver.execute_script(
        "var live = document.getElementById('live');"
        "var updated = live && live.hasAttribute('data-stale') && live.querySelector('.updated');"
        "return updated ? window.getComputedStyle(updated, '::after').content : null;"
    )
    return notice is not None and "does not answer" in notice


def filter_job_list(driver: WebDriver, served: Served, *, state: str, queue: str) -> list[WebElement]:
    """The job list's rows of ``state`` in ``queue``, filtered as a person does: the menu, the select boxes, Filter."""
    click_through(driver, driver.find_element(By.LINK_TEXT, "Jobs"), "the menu's Jobs")
    assert driver.title == "Jobs · syncjobs"
    Select(driver.find_element(By.NAME, "state")).select_by_value(state)
    Select(driver.find_element(By.NAME, "queue")).select_by_value(queue)
    click_through(driver, driver.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]"), "the filter")
    filtered = urlsplit(at(driver, served))
    assert filtered.path == "/jobs"
    assert parse_qs(filtered.query) == {"state": [state], "queue": [queue]}  # the empty name left out
    rows: list[WebElement] = driver.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
    return rows


# -- the tests ---------------------------------------------------------------------------


def test_log_in_and_the_overview_updates_in_place(dashboard: Served, browser: WebDriver, shots: Shots) -> None:
    driver = browser
    driver.get(dashboard.origin + "/jobs?state=dead")
    assert at(driver, dashboard) == "/login?next=%2Fjobs%3Fstate%3Ddead"  # never open: the login first
    driver.find_element(By.ID, "token").send_keys("not-the-token")
    click_through(driver, driver.find_element(By.ID, "login"), "a wrong login")
    [error] = driver.find_elements(By.CSS_SELECTOR, "p.notice.error")
    assert error.text == "Wrong token."
    assert driver.find_element(By.ID, "token").get_attribute("value") == ""  # not echoed back
    shots.take(driver, "login-refused")
    assert_same_origin(driver, dashboard)

    driver.find_element(By.ID, "token").send_keys(dashboard.token)
    click_through(driver, driver.find_element(By.ID, "login"), "the login")
    assert at(driver, dashboard) == "/jobs?state=dead"  # where it was going
    assert not driver.find_elements(By.CSS_SELECTOR, "p.notice.error")
    click_through(driver, driver.find_element(By.LINK_TEXT, "Overview"), "the menu's Overview")
    assert driver.title == "Overview · syncjobs"
    assert at(driver, dashboard) == "/"
    assert driver.find_element(By.ID, "done-hour").text.isdigit()
    shots.take(driver, "overview")
    assert_same_origin(driver, dashboard)

    # A queue no one works on yet: three jobs dispatched from here appear without a reload.
    waiting = dashboard.queue("live", workers=0)

    @waiting.task(name="web.browser.waits")
    def waits(n: int) -> int:
        return n

    assert ready_count(driver, waiting.queue_name) is None
    driver.execute_script("window.__noReload = 1")
    for n in range(3):
        waits.dispatch(n)
    wait_for(driver, lambda d: ready_count(d, waiting.queue_name) == "3", "the overview to show 3 ready jobs")
    assert driver.execute_script("return window.__noReload") == 1, "the page was reloaded, not updated in place"
    assert at(driver, dashboard) == "/"
    fetched = driver.execute_script(
        "return performance.getEntriesByType('resource').filter(function (e) {"
        " return e.initiatorType === 'fetch'; }).map(function (e) { return e.name; })"
    )
    assert dashboard.origin + "/?part=live" in fetched
    shots.take(driver, "overview-updated")
    assert_same_origin(driver, dashboard)
    assert_console_clean(driver)


def test_a_dead_job_found_in_the_job_list_is_retried_and_done(
    dashboard: Served, browser: WebDriver, shots: Shots
) -> None:
    driver = browser
    log_in(driver, dashboard)
    fixed = threading.Event()
    died = threading.Event()
    worker = dashboard.queue("dead", workers=1)

    @worker.task(name="web.browser.prints", max_attempts=3)
    def prints(pages: int) -> dict[str, int]:
        if not fixed.is_set():
            raise syncjobs.Fatal(MARKUP_ERROR)
        return {"pages": pages}

    worker.on_dead_letter(lambda dead: died.set())
    worker.start()
    job_id = prints.dispatch(12).id
    assert died.wait(BROWSER_WAIT), "the job never died"

    rows = filter_job_list(driver, dashboard, state="dead", queue=worker.queue_name)
    assert [row.get_attribute("data-job") for row in rows] == [job_id]
    assert rows[0].find_element(By.CSS_SELECTOR, "span.state").text == "dead"
    assert MARKUP_ERROR in rows[0].find_element(By.CSS_SELECTOR, "td.error").text
    shots.take(driver, "jobs-dead")
    assert_same_origin(driver, dashboard)

    click_through(driver, rows[0].find_element(By.TAG_NAME, "a"), "the job's link")
    assert at(driver, dashboard) == f"/jobs/{job_id}"
    assert driver.find_element(By.ID, "job-state").text == "dead"
    error = driver.find_element(By.CSS_SELECTOR, "pre.error")
    assert MARKUP_ERROR in error.text  # as text: the markup shown, not applied
    assert not error.find_elements(By.TAG_NAME, "em")
    assert '"pages": 12' in driver.find_element(By.CSS_SELECTOR, "pre.payload").text
    assert not driver.find_elements(By.CSS_SELECTOR, "pre.result")
    shots.take(driver, "job-dead")
    assert_same_origin(driver, dashboard)

    click_through(driver, driver.find_element(By.ID, "retry"), "Retry…")
    assert at(driver, dashboard) == f"/jobs/{job_id}/retry"
    assert driver.find_element(By.TAG_NAME, "h1").text == "Retry this dead job?"
    shots.take(driver, "confirm-retry")
    assert_same_origin(driver, dashboard)
    # Fixed while the job is dead, so that nothing runs it in between: once retried, a worker may take it
    # before the next page has even loaded, and a run that failed again would make it dead again.
    fixed.set()
    click_through(driver, driver.find_element(By.ID, "confirm"), "the confirmation")
    # The notice shows once: the page's script takes ?done= off the address, so a reload does not repeat it.
    assert at(driver, dashboard) == f"/jobs/{job_id}"
    assert driver.find_element(By.CSS_SELECTOR, "p.notice").text == "Queued again with fresh attempts."
    shots.take(driver, "job-retried")

    def done(d: WebDriver) -> bool:
        d.refresh()
        return d.find_element(By.ID, "job-state").text == "done"

    wait_for(driver, done, "the retried job to be done", navigates=True)
    assert '"pages": 12' in driver.find_element(By.CSS_SELECTOR, "pre.result").text
    assert not driver.find_elements(By.ID, "retry")
    assert not driver.find_elements(By.ID, "cancel")
    shots.take(driver, "job-done")
    assert_same_origin(driver, dashboard)
    assert_console_clean(driver)


def test_a_payload_with_markup_shows_as_text_and_runs_nothing(
    dashboard: Served, browser: WebDriver, shots: Shots
) -> None:
    driver = browser
    log_in(driver, dashboard)
    waiting = dashboard.queue("markup", workers=0)

    @waiting.task(name="web.browser.echoes")
    def echoes(text: str) -> str:
        return text

    job_id = echoes.dispatch(SCRIPT).id
    # Found by its id, in the job list's search box.
    click_through(driver, driver.find_element(By.LINK_TEXT, "Jobs"), "the menu's Jobs")
    assert driver.title == "Jobs · syncjobs"
    driver.find_element(By.NAME, "id").send_keys(job_id)
    click_through(driver, driver.find_element(By.CSS_SELECTOR, "form.search button[type=submit]"), "the search")
    assert at(driver, dashboard) == f"/jobs/{job_id}"
    assert driver.find_element(By.ID, "job-state").text == "queued"
    assert SCRIPT in driver.find_element(By.CSS_SELECTOR, "pre.payload").text
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    scripts = driver.execute_script("return Array.from(document.scripts, function (s) { return s.src; })")
    assert scripts == [dashboard.origin + "/static/dashboard.js"]  # the dashboard's own, and no other
    shots.take(driver, "job-with-markup")
    assert_same_origin(driver, dashboard)

    click_through(driver, driver.find_element(By.ID, "cancel"), "Cancel…")
    assert at(driver, dashboard) == f"/jobs/{job_id}/cancel"
    shots.take(driver, "confirm-cancel")
    click_through(driver, driver.find_element(By.ID, "confirm"), "the confirmation")
    assert driver.find_element(By.CSS_SELECTOR, "p.notice").text == "Cancelled: it will not run."
    assert driver.find_element(By.ID, "job-state").text == "cancelled"
    assert SCRIPT in driver.find_element(By.CSS_SELECTOR, "pre.payload").text
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    shots.take(driver, "job-cancelled")
    assert_same_origin(driver, dashboard)
    assert_console_clean(driver)


def test_the_overview_says_so_while_the_server_does_not_answer(
    dashboard: Served, dashboard_proxy: FaultProxy, browser: WebDriver, shots: Shots
) -> None:
    """Black-holed, then refused, on the path between the browser and the dashboard: stale, and live again after.

    Black-holed, the refresh waits: the page says the server does not answer
    after its patience, and takes the late answer once the path flows again.
    """
    driver = browser
    proxy = dashboard_proxy
    through = dataclasses.replace(dashboard, origin=f"http://127.0.0.1:{proxy.port}")
    log_in(driver, through)
    waiting = dashboard.queue("stale", workers=0)

    @waiting.task(name="web.browser.stale")
    def waits(n: int) -> int:
        return n

    waits.dispatch(0)
    wait_for(driver, lambda d: ready_count(d, waiting.queue_name) == "1", "the overview to show 1 ready job")
    assert not stale(driver)
    driver.execute_script("window.__noReload = 1")
    ready = 1
    for fault, make in (("blackholed", proxy.blackhole), ("refused", proxy.refuse)):
        make()
        began = time.monotonic()
        wait_for(driver, stale, f"the overview to say the server does not answer ({fault})")
        print(f"{fault}: stale after {time.monotonic() - began:.1f} s")  # noqa: T201 - for `pytest -rA`
        assert ready_count(driver, waiting.queue_name) == str(ready)  # the last counts it had, still shown
        shots.take(driver, f"overview-{fault}")
        proxy.resume()
        began = time.monotonic()
        wait_for(driver, lambda d: not stale(d), f"the overview to be live again after being {fault}")
        waits.dispatch(ready)
        ready += 1
        wait_for(
            driver,
            lambda d, shown=str(ready): ready_count(d, waiting.queue_name) == shown,
            f"the overview to show {ready} ready jobs after being {fault}",
        )
        print(f"{fault}: live again after {time.monotonic() - began:.1f} s")  # noqa: T201 - for `pytest -rA`
        shots.take(driver, f"overview-after-{fault}")
    assert driver.execute_script("return window.__noReload") == 1, "the page was reloaded, not updated in place"
    assert at(driver, through) == "/"
    # The refused fetches' failed loads, and nothing else: no script error (an abort left unhandled, say).
    refused = "/?part=live - Failed to load resource: net::"
    unexpected = [
        entry
        for entry in driver.get_log("browser")
        if entry.get("level") in ("SEVERE", "WARNING")
        and not (entry.get("source") == "network" and refused in entry.get("message", ""))
    ]
    assert not unexpected, unexpected
