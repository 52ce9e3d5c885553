"""Make docs/dashboard-overview.png, the README's picture of the dashboard's overview.

Fills a temporary SQLite database with what a small deployment looks like,
serves it with ``syncjobs web`` (a process of its own, as an operator runs
it), logs in with Debian's headless chromium through Selenium and saves the
overview::

    python docs/make_screenshot.py            # writes docs/dashboard-overview.png
    python docs/make_screenshot.py --out /tmp/overview.png

What the picture shows, and where it comes from:

* four queues: ``emails`` and ``thumbnails`` with live workers (of this
  process) busy on long jobs and a backlog ready behind them; ``webhooks``,
  whose worker has stopped, with dead letters and retries waiting their
  turn; ``reports``, which no worker serves yet, with jobs ready and jobs
  scheduled for tonight;
* a few hundred jobs really run first by those workers, of varying
  durations, some failing for good: the current minute's bar of the
  throughput chart and each queue's "Done, last minute";
* the hour before: the script cannot wait an hour, so the earlier minutes'
  counts are written into the table's done counters (``<table>_done``, one row
  per queue and second, as the workers write them) on a plausible daily curve.

Needs chromium and chromedriver at /usr/bin (Debian's ``chromium`` and
``chromium-driver``) and selenium (the ``test`` extra). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import random
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import syncjobs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: the checkout's tests/ too
from tests.chromium import CHROMEDRIVER, CHROMIUM, chromium

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "dashboard-overview.png"
WIDTH, HEIGHT = 1280, 900
TABLE = "syncjobs_jobs"
#: What a worker's outcome adds to the table's done counters (the table's name in full: TABLE's).
COUNT_DONE = (
    "INSERT INTO syncjobs_jobs_done (queue, bucket, done) VALUES (?, ?, ?) "
    "ON CONFLICT (queue, bucket) DO UPDATE SET done = done + excluded.done"
)
#: How long anything this script waits on may take.
WAIT = 60.0


def log(message: str) -> None:
    sys.stderr.write(f"make_screenshot: {message}\n")
    sys.stderr.flush()


def pause(seconds: float, *, stop: threading.Event) -> None:
    """A job's work: ``seconds`` of it; cut short (``Cancelled``) if the job is cancelled or ``stop`` is set."""
    info = syncjobs.current_job()
    cancelled = info.cancelled if info is not None else threading.Event()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if cancelled.wait(min(left, 0.05)) or stop.is_set():
            raise syncjobs.Cancelled()


# -- the queues and their jobs ---------------------------------------------------------------------


class Deployment:
    """The four queues on one database, their tasks, and the jobs that make the picture."""

    def __init__(self, url: str, seed: int = 7) -> None:
        self.url = url
        self.random = random.Random(seed)  # noqa: S311 - a picture made again the same, not a secret
        self.stop = threading.Event()  # ends the long jobs at once when the script is done
        self.emails = syncjobs.DatabaseJobQueue(url, queue="emails", workers=4, prefetch=0, poll_interval=0.2)
        self.thumbnails = syncjobs.DatabaseJobQueue(url, queue="thumbnails", workers=2, prefetch=0, poll_interval=0.2)
        self.webhooks = syncjobs.DatabaseJobQueue(url, queue="webhooks", workers=3, prefetch=0, poll_interval=0.2)
        self.reports = syncjobs.DatabaseJobQueue(url, queue="reports", workers=0)
        self.all = [self.emails, self.thumbnails, self.webhooks, self.reports]
        for queue in self.all:
            queue.on_dead_letter(lambda dead: None)  # dead letters are what the picture wants: logged at WARNING
        stop = self.stop

        @self.emails.task(name="send_email", max_attempts=5)
        def send_email(user_id: int, template: str, seconds: float) -> None:
            pause(seconds, stop=stop)
            if user_id % 97 == 0:
                raise syncjobs.Fatal(f"no such user {user_id}")

        @self.thumbnails.task(name="make_thumbnail", max_attempts=3)
        def make_thumbnail(image: str, sizes: list[int], seconds: float) -> dict[str, list[int]]:
            pause(seconds, stop=stop)
            return {"sizes": sizes}

        @self.webhooks.task(name="deliver_webhook", max_attempts=8, retry_wait=lambda attempt: 600.0 * (attempt + 1))
        def deliver_webhook(endpoint: str, event: str, seconds: float) -> None:
            pause(seconds, stop=stop)
            if endpoint.endswith("/gone"):
                raise syncjobs.Fatal(f"HTTP 410 Gone from {endpoint}")
            if endpoint.endswith("/slow"):
                raise syncjobs.Retryable(f"timed out after 10s posting to {endpoint}")

        @self.reports.task(name="build_report", max_attempts=2)
        def build_report(account: int, period: str) -> None:
            raise AssertionError("no worker serves reports while the picture is taken")

        self.send_email, self.make_thumbnail = send_email, make_thumbnail
        self.deliver_webhook, self.build_report = deliver_webhook, build_report

    def run_some(self) -> None:
        """A few hundred jobs of varying durations, really run by the workers, some failing for good."""
        r = self.random
        for queue in (self.emails, self.thumbnails, self.webhooks):
            queue.start()
        for n in range(360):
            user = 1000 + n * 7 + r.randrange(7)
            template = r.choice(["welcome", "receipt", "password_reset", "digest"])
            self.send_email.dispatch(user, template, round(r.uniform(0.005, 0.06), 3))
        for n in range(80):
            sizes = r.sample([64, 128, 256, 512, 1024], 3)
            self.make_thumbnail.dispatch(f"uploads/2024/{n:04d}.jpg", sorted(sizes), round(r.uniform(0.02, 0.2), 3))
        endpoints = [f"https://hooks.example.com/{n}" for n in range(40)]
        endpoints += [f"https://shop-{n}.example.net/gone" for n in range(4)]
        endpoints += [f"https://crm-{n}.example.org/slow" for n in range(6)]
        r.shuffle(endpoints)
        for endpoint in endpoints:
            self.deliver_webhook.dispatch(endpoint, r.choice(["order.paid", "order.shipped"]), r.uniform(0.01, 0.1))
        # The emails and thumbnails run through; the webhooks that failed wait, dead or for their retry.
        wait_for(
            lambda: all(q.counts().queued == 0 and q.counts().running == 0 for q in self.all[:3]), "the first jobs"
        )
        self.webhooks.shutdown(grace=0)  # its worker stopped: its dead letters and retries stay

    def leave_work(self) -> None:
        """What the overview shows: long jobs running, a backlog behind them, jobs scheduled for later."""
        r = self.random
        for _ in range(4):
            self.send_email.dispatch(r.randrange(1000, 9000), "digest", 600.0)
        for _ in range(2):
            self.make_thumbnail.dispatch(f"uploads/2024/{r.randrange(10000):04d}.tiff", [256, 1024], 600.0)
        for n in range(37):
            self.send_email.dispatch(9000 + n, r.choice(["welcome", "receipt"]), 0.02)
        for n in range(9):
            self.make_thumbnail.dispatch(f"uploads/2024/{2000 + n:04d}.jpg", [64, 256], 0.1)
        for account in (17, 42):
            self.build_report.dispatch(account, "2024-05")
        for account in (17, 42, 101, 314, 2718):
            self.build_report.using(delay=6 * 3600 + account).dispatch(account, "2024-06")
        wait_for(
            lambda: self.emails.counts().running == 4 and self.thumbnails.counts().running == 2, "the long jobs to run"
        )

    def shutdown(self) -> None:
        self.stop.set()
        for queue in self.all:
            queue.shutdown(grace=0)


def backfill_history(db_file: Path, now: float, seed: int = 11) -> None:
    """The hour before the real run: done counts per minute on a plausible curve, as the workers record them."""
    r = random.Random(seed)  # noqa: S311 - a picture made again the same, not a secret
    this_minute = int(now // 60) * 60
    rows = []
    for minutes_ago in range(1, 60):
        base = 260 + 140 * math.sin(minutes_ago / 9.0) + 60 * math.sin(minutes_ago / 2.3)
        total = max(0, int(base * r.uniform(0.8, 1.15)))
        if minutes_ago in (23, 24):  # a deploy: the workers restarted
            total //= 6
        shares = {"emails": 0.72, "thumbnails": 0.18, "webhooks": 0.10}
        for queue, share in shares.items():
            count = int(total * share)
            # Spread over the minute's seconds, a few rows each, as a steady stream leaves them.
            for second in sorted(r.sample(range(60), 6)):
                bucket = this_minute - minutes_ago * 60 + second
                if bucket < now - 60:  # "done, last minute" is the real run's alone
                    rows.append((queue, bucket, count // 6))
    with contextlib.closing(sqlite3.connect(db_file)) as conn, conn:
        conn.executemany(COUNT_DONE, rows)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"make_screenshot: timed out waiting for {what}")
        time.sleep(0.1)


# -- serving and taking the picture -------------------------------------------------------------


@contextlib.contextmanager
def served(url: str) -> Iterator[tuple[str, str]]:
    """``syncjobs web`` on ``url``: (its address, its token); stopped with SIGTERM after."""
    token = secrets.token_urlsafe(16)
    proc = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-m", "syncjobs", "web", "--url", url, "--port", "0", "--refresh", "1"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "SYNCJOBS_WEB_TOKEN": token, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline() if proc.stdout is not None else ""  # the one line it prints, once it serves
        found = re.search(r" at (http://\S+?)/?$", line)
        if found is None:
            raise SystemExit(f"make_screenshot: syncjobs web did not start: {line!r}")
        yield found[1], token
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if code != 0:
            log(f"syncjobs web exited with {code}")


@contextlib.contextmanager
def browser(profile: Path) -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"make_screenshot: {path} is missing (apt-get install chromium chromium-driver)")
    with chromium(profile, "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}") as driver:
        yield driver


def cell(driver: WebDriver, queue: str, state: str) -> str | None:
    found: str | None = driver.execute_script(
        "var q = arguments[0], s = arguments[1];"
        "var row = Array.from(document.querySelectorAll('#live tr[data-queue]'))"
        "  .find(function (r) { return r.getAttribute('data-queue') === q; });"
        "var c = row && row.querySelector('td[data-state=\"' + s + '\"]');"
        "return c ? c.textContent.trim() : null;",
        queue,
        state,
    )
    return found


def take(origin: str, token: str, out: Path, profile: Path) -> None:
    with browser(profile) as driver:
        driver.get(origin + "/")
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "login").click()
        wait = WebDriverWait(driver, WAIT, poll_frequency=0.1)
        wait.until(lambda d: d.title.startswith("Overview"), "the overview")
        wait.until(
            lambda d: cell(d, "emails", "running") == "4" and cell(d, "thumbnails", "running") == "2", "the counts"
        )
        # The viewport itself WIDTH x HEIGHT (the window's size counts its frame), or the whole page if taller.
        tall = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": max(HEIGHT, int(tall)), "deviceScaleFactor": 1, "mobile": False},
        )
        # One more refresh of the live part in the new size: its "Updated" line changes.
        updated = driver.find_element(By.CSS_SELECTOR, "#live .updated").text
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#live .updated").text != updated, "a refresh")
        out.parent.mkdir(parents=True, exist_ok=True)
        if not driver.save_screenshot(str(out)):
            raise SystemExit(f"make_screenshot: chromium saved no screenshot to {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the PNG to write (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    # The dead letters and the long jobs cut short at the end are what the picture wants: not worth a word.
    logging.getLogger("syncjobs").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="syncjobs-") as tmp:
        db_file = Path(tmp) / "jobs.db"
        url = f"sqlite:///{db_file}"
        deployment = Deployment(url)
        try:
            for queue in deployment.all:
                queue.install_schema()
            log("running a few hundred jobs")
            began = time.time()
            deployment.run_some()
            log(f"ran them in {time.time() - began:.1f}s; the hour before, the backlog and the long jobs")
            backfill_history(db_file, time.time())
            deployment.leave_work()
            with served(url) as (origin, token):
                log(f"serving at {origin}; taking the picture")
                take(origin, token, args.out, Path(tmp) / "chromium-profile")
        finally:
            deployment.shutdown()
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
