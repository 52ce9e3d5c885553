"""The app tests/test_gunicorn.py serves with a real gunicorn: embedded mode, one worker thread per process.

Its database and queue come from the environment (``GUNICORN_APP_URL``,
``GUNICORN_APP_QUEUE``); the test dispatches :class:`Meet` jobs from its own
process and never sends a request.
"""

from __future__ import annotations

import dataclasses
import os

from flask import Flask

import syncjobs
from syncjobs.contrib.flask import SyncJobs

jobs = SyncJobs()


@jobs.register
@dataclasses.dataclass
class Meet(syncjobs.Job):
    """Marks its process in ``folder``, waits until ``processes`` processes have, and returns its pid.

    With one worker thread per process, a run that ends ``done`` proves that
    the other process was running a job at the same time.
    """

    NAME = "gunicorn_app.meet"
    MAX_ATTEMPTS = 1
    folder: str
    processes: int = 2

    def run(self) -> int:
        info = syncjobs.current_job()
        assert info is not None
        pid = os.getpid()
        with open(os.path.join(self.folder, f"{pid}-{info.id}"), "w", encoding="utf-8"):
            pass
        while len({name.partition("-")[0] for name in os.listdir(self.folder)}) < self.processes:
            # The poll interval of a wait that shutdown's cancel token ends, not a synchronisation.
            if info.cancelled.wait(0.005):
                raise syncjobs.Cancelled()
        return pid


def create_app() -> Flask:
    """gunicorn's ``tests.gunicorn_app:create_app()``: an app factory, as the README shows."""
    app = Flask(__name__)
    app.config.update(
        SYNCJOBS_URL=os.environ["GUNICORN_APP_URL"],
        SYNCJOBS_QUEUES=[os.environ["GUNICORN_APP_QUEUE"]],
        SYNCJOBS_EMBEDDED=True,
        SYNCJOBS_WORKERS=1,
    )
    jobs.init_app(app)
    return app
