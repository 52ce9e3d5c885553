"""``syncjobs_worker --reload``: restart the worker when the code changes, with the signals of a worker.

Django's own reloader (``run_with_reloader``) is made for ``runserver``: its
first process answers SIGTERM with ``sys.exit(0)``, which kills the worker
process at once, and a Ctrl-C reaches both while the first kills the second
a quarter of a second later: either way running jobs get no grace and are
left to their lease. Here the first process only supervises: it passes each
SIGTERM / SIGINT on to the worker once (the worker runs in a session of its
own, so a terminal's Ctrl-C reaches the supervisor alone; a hangup becomes a
SIGTERM), and starts the
worker again when it stopped for a code change. The worker watches the files
with Django's reloader and, on a change, stops as a signal would (the grace,
then what still runs is handed back) before it exits to be restarted.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType

from django.utils import autoreload

from syncjobs.cli.worker import StopRequest

logger = logging.getLogger("syncjobs.worker")

#: The worker's exit code that asks its supervisor for a restart (Django's own).
RELOAD = 3

#: What the supervisor passes on, as what. A hangup (the terminal closed)
#: reaches only the supervisor's session: the worker stops as on SIGTERM
#: rather than live on without it.
_PASSED_ON = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT, signal.SIGHUP: signal.SIGTERM}

#: ``serve(on_ready)``: run the worker until it stops; its exit code.
Serve = Callable[[Callable[[StopRequest], None]], int]


def run(serve: Serve) -> int:
    """In the first process, supervise; in the worker process it starts, ``serve`` with a file watcher."""
    if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true":
        return _watched(serve)
    return _Supervisor().run()


class _Supervisor:
    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        #: Signals that came while no worker ran: passed on to the next one.
        self.unsent: list[int] = []
        self.received = False

    def run(self) -> int:
        args = autoreload.get_child_arguments()
        env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
        previous = {signum: signal.signal(signum, self._on_signal) for signum in _PASSED_ON}
        try:
            while True:
                child = subprocess.Popen(args, env=env, start_new_session=True)  # noqa: S603 - this very command
                self.child = child
                for signum in self.unsent:
                    child.send_signal(signum)
                self.unsent.clear()
                code = child.wait()
                self.child = None
                if code != RELOAD:
                    return code
                if self.received:  # stopped for a change, and told to stop meanwhile
                    return 0
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.received = True
        passed_on = _PASSED_ON[signal.Signals(signum)]
        if self.child is None:
            self.unsent.append(passed_on)
        else:
            self.child.send_signal(passed_on)


def _watched(serve: Serve) -> int:
    """The worker process: ``serve``, stopped (with the grace) by a code change, then exit for a restart."""
    reloader = autoreload.get_reloader()
    stops: list[StopRequest] = []

    def notify_file_changed(path: object) -> None:
        # As Django's reloader decides (a receiver that handles the change,
        # as the template and translation reloaders do, means no restart),
        # but the restart is a graceful stop, not its sys.exit(3) in the watcher thread.
        results = autoreload.file_changed.send(sender=reloader, file_path=path)
        if not any(result for _, result in results):
            stops[0](f"{path} changed", RELOAD)

    # Instance attribute: the one step of Django's reloader that differs.
    setattr(reloader, "notify_file_changed", notify_file_changed)  # noqa: B010 - a method, replaced on this instance
    watcher = threading.Thread(
        target=reloader.run, args=(threading.main_thread(),), name="syncjobs-reloader", daemon=True
    )

    def watch(stop: StopRequest) -> None:
        stops.append(stop)
        watcher.start()

    try:
        return serve(watch)
    finally:
        reloader.stop()
