"""A small Flask app for the integration tests: a route that dispatches, a job that reads ``current_app``."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from flask import Flask, current_app, request

import syncjobs
from syncjobs.contrib.flask import SyncJobs
from tests import cli_jobs

jobs = SyncJobs()
# What the worker command tests (tests/test_worker_commands.py) run.
jobs.register(cli_jobs.Sleepy)
jobs.register(cli_jobs.Stubborn)


@jobs.register
@dataclasses.dataclass
class Greet(syncjobs.Job):
    """Writes what it saw of the app to ``out``: proof that it ran inside the app's context."""

    NAME = "flaskapp.greet"
    out: str
    seconds: float = 0.0

    def run(self) -> None:
        info = syncjobs.current_job()
        assert info is not None
        if self.seconds:
            with open(f"{self.out}.started", "w", encoding="utf-8"):
                pass  # tells a test this long job is running
            if info.cancelled.wait(self.seconds):
                raise syncjobs.Cancelled()
        seen = {"app": current_app.name, "greeting": current_app.config["GREETING"], "pid": os.getpid()}
        with open(self.out, "a", encoding="utf-8") as file:
            file.write(json.dumps(seen) + "\n")


@jobs.register
@dataclasses.dataclass
class Doomed(syncjobs.Job):
    """Fails for good at once: a dead letter."""

    NAME = "flaskapp.doomed"
    reason: str

    def run(self) -> None:
        raise syncjobs.Fatal(self.reason)


@jobs.task(name="flaskapp.note")
def note(out: str, *, text: str) -> None:
    """A function task: writes its text and the app it ran in."""
    with open(out, "a", encoding="utf-8") as file:
        file.write(json.dumps({"app": current_app.name, "text": text}) + "\n")


def create_app(name: str = "shopfront", **config: Any) -> Flask:
    app = Flask(name)
    app.config.update(GREETING=f"hello from {name}", **config)
    jobs.init_app(app)

    @app.post("/greet")
    def greet() -> dict[str, str]:
        job = Greet(out=request.form["out"], seconds=float(request.form.get("seconds", 0)))
        return {"job": jobs.dispatch(job)}

    @app.post("/note")
    def post_note() -> dict[str, str]:
        return {"job": note.using(queue=request.form.get("queue")).dispatch(request.form["out"], text="hi")}

    return app
