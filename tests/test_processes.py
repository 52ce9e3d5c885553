"""What a user meets from the outside: the demo, Ctrl-C, and interpreter exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import WAIT, popen_interruptible
from tests.test_database import execute

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return popen_interruptible(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        **kwargs,
    )


def _communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for the process; on a timeout, kill it so that no hung child outlives the test."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise


def test_the_demo_runs_every_job_and_prints_a_summary() -> None:
    proc = _python("-m", "syncjobs", "demo", "--jobs", "120")
    out, err = _communicate(proc, 60)
    assert proc.returncode == 0, err
    summary = [line for line in out.splitlines() if line.startswith("summary:")]
    assert len(summary) == 1
    assert summary[0].startswith("summary: 119 done, 1 dead, 0 pending")
    assert "dead letter demo.charge_card" in out
    assert "fatal: card declined" in out


def test_ctrl_c_during_the_demo_shuts_down_gracefully() -> None:
    proc = _python("-m", "syncjobs", "demo", "--jobs", "100000", "--grace", "1")
    assert proc.stdout is not None
    # The first progress line says the workers are running.
    while not (line := proc.stdout.readline()).startswith("done"):
        assert line, f"the demo ended before its first progress line: {_communicate(proc, WAIT)}"
    proc.send_signal(signal.SIGINT)
    out, err = _communicate(proc, WAIT + 20)
    assert proc.returncode == 130, err
    assert "interrupted: shutting down" in out
    assert "summary:" in out
    assert "Traceback" not in err


def test_interpreter_exit_warns_once_of_lost_jobs_and_does_not_hang() -> None:
    script = textwrap.dedent(
        """
        import dataclasses, logging, threading, syncjobs
        logging.basicConfig(format="%(levelname)s %(message)s")
        started = threading.Event()

        @dataclasses.dataclass
        class Slow(syncjobs.Job):
            NAME = "slow"
            def run(self):
                started.set()
                syncjobs.current_job().cancelled.wait(60)

        queue = syncjobs.InMemoryJobQueue(workers=1)
        queue.register(Slow)
        queue.start()
        for _ in range(3):
            queue.dispatch(Slow())
        started.wait(10)
        print("exiting", flush=True)
        """
    )
    proc = _python("-c", script)
    out, err = _communicate(proc, 30)
    assert proc.returncode == 0, err
    assert out == "exiting\n"
    warnings = [line for line in err.splitlines() if "still pending" in line]
    assert warnings == [
        "WARNING the interpreter is exiting with 3 job(s) still pending in an in-memory queue: they are lost "
        "(call shutdown() and join() before exit, or use a database backend)"
    ], err


# A script's start: logging to stderr, and a job that does nothing.
_NOOP_JOB = """
import dataclasses, gc, logging, syncjobs
logging.basicConfig(format="%(levelname)s %(message)s")

@dataclasses.dataclass
class Noop(syncjobs.Job):
    NAME = "noop"
    def run(self):
        pass
"""


def _exits_cleanly_with_warning(script: str, lost: int) -> None:
    proc = _python("-c", _NOOP_JOB + textwrap.dedent(script))
    _, err = _communicate(proc, 30)
    assert proc.returncode == 0, err
    warnings = [line for line in err.splitlines() if "still pending" in line]
    assert len(warnings) == 1, err
    assert f"exiting with {lost} job(s) still pending" in warnings[0]


def test_a_started_queue_its_owner_dropped_is_still_stopped_at_exit() -> None:
    _exits_cleanly_with_warning(
        """
        def fire_and_forget():
            queue = syncjobs.InMemoryJobQueue(workers=2)
            queue.register(Noop)
            queue.dispatch(Noop(), delay=3600)
            queue.start()

        fire_and_forget()
        gc.collect()
        """,
        lost=1,
    )


def test_exit_after_quick_restarts_does_not_hang() -> None:
    _exits_cleanly_with_warning(
        """
        queue = syncjobs.InMemoryJobQueue(workers=4)
        queue.register(Noop)
        for _ in range(10):
            queue.start()
            queue.shutdown(grace=0)
        queue.start()
        queue.dispatch(Noop(), delay=3600)
        """,
        lost=1,
    )


def test_a_clean_exit_says_nothing() -> None:
    script = _NOOP_JOB + textwrap.dedent(
        """
        with syncjobs.InMemoryJobQueue() as queue:
            queue.register(Noop)
            queue.dispatch(Noop())
            assert queue.join(10)
        """
    )
    proc = _python("-c", script)
    out, err = _communicate(proc, 30)
    assert (proc.returncode, out, err) == (0, "", "")


SERVE_OFF_THE_MAIN_THREAD = textwrap.dedent(
    """
    import logging, sys, threading
    import syncjobs
    from syncjobs.cli.worker import serve

    logging.basicConfig(level=logging.INFO)

    burst = sys.argv[1] == "burst"
    queue = syncjobs.InMemoryJobQueue(2, shutdown_grace=0.5)

    running = threading.Event()
    ready = threading.Event()

    class Out:  # serve()'s output: the readiness line says it is serving
        def write(self, text):
            if "syncjobs worker ready" in text:
                ready.set()
            return sys.stdout.write(text)

        def flush(self):
            sys.stdout.flush()

    @queue.register
    class Nap(syncjobs.Job):
        NAME = "nap"
        def run(self):
            running.set()
            syncjobs.current_job().cancelled.wait(60)

    if not burst:
        queue.dispatch(Nap())  # still running when the interpreter exits
    # As under Django's autoreloader: serve() in a thread, no signal handlers.
    server = threading.Thread(target=serve, args=([queue],), kwargs={"burst": burst, "out": Out()}, daemon=True)
    server.start()
    if burst:
        server.join(30)
        print("served", not server.is_alive(), flush=True)
    else:
        assert ready.wait(30), "serve() never said it was ready"
        assert running.wait(30), "the job never started"
    # The main thread ends here: the exit hook stops the workers (or finds them stopped).
    """
)


def test_serve_off_the_main_thread_lets_the_interpreter_exit() -> None:
    # After --burst ended on its own, the exit hook has nothing to wait for.
    proc = _python("-c", SERVE_OFF_THE_MAIN_THREAD, "burst")
    out, err = _communicate(proc, WAIT + 20)
    assert proc.returncode == 0, err
    assert "served True" in out
    # Still serving at exit: the running job gets the grace, is handed back, and the process ends.
    proc = _python("-c", SERVE_OFF_THE_MAIN_THREAD, "serving")
    out, err = _communicate(proc, WAIT + 20)
    assert proc.returncode == 0, err
    assert "the interpreter is exiting: stopping; running jobs get 0.5s" in err
    assert re.search(r"job nap \(\S+\) run 1 of 5 in [\d.]+ms: aborted: handed back at shutdown", err), err


SERVE_OFF_THE_MAIN_THREAD_STOPPING = textwrap.dedent(
    """
    import logging, sys, threading
    import syncjobs
    from syncjobs.cli.worker import serve

    logging.basicConfig(level=logging.INFO)
    mode, url = sys.argv[1], sys.argv[2]
    queue = syncjobs.DatabaseJobQueue(url, workers=2, shutdown_grace=0.5, poll_interval=0.2)
    moment = threading.Event()

    class Out:
        def write(self, text):
            if mode == "burst" and "syncjobs worker ready" in text:
                moment.set()
            return sys.stdout.write(text)

        def flush(self):
            sys.stdout.flush()

    class Spot(logging.Handler):
        def emit(self, record):
            if mode == "max-jobs" and "max-jobs reached: stopping" in record.getMessage():
                moment.set()

    logging.getLogger("syncjobs.worker").addHandler(Spot())

    @queue.register
    class Quick(syncjobs.Job):
        NAME = "quick"
        def run(self):
            pass

    for _ in range(4):
        queue.dispatch(Quick())
    options = {"burst": True} if mode == "burst" else {"max_jobs": 1}
    threading.Thread(target=serve, args=([queue],), kwargs={**options, "out": Out()}, daemon=True).start()
    assert moment.wait(30), "serve() never got there"
    # The main thread ends as serve() stops (max-jobs) or right after it is ready
    # (burst): as under Django's autoreloader when a file changes.
    """
)


@pytest.mark.parametrize("mode", ["max-jobs", "burst"])
def test_serve_off_the_main_thread_starts_no_thread_once_the_interpreter_may_exit(mode: str, tmp_path: Path) -> None:
    # Python 3.12+ refuses new threads once the main thread has ended; serve()
    # used to start its stopper then, and the database workers were never stopped.
    proc = _python("-c", SERVE_OFF_THE_MAIN_THREAD_STOPPING, mode, f"sqlite:///{tmp_path / 'jobs.db'}")
    out, err = _communicate(proc, WAIT + 20)
    assert proc.returncode == 0, err
    assert "syncjobs worker ready" in out
    assert "Traceback" not in err, err
    assert "stopped" in err, err
    # Every run ended, or was handed back: no row is left leased to a process that is gone.
    assert execute(
        f"sqlite:///{tmp_path / 'jobs.db'}", "SELECT COUNT(*) FROM syncjobs_jobs WHERE state IN ('running', 'claimed')"
    ) == [(0,)]


SIGNAL_TAKEN_BY_ANOTHER_THREAD = textwrap.dedent(
    """
    import logging, signal, sys, threading
    import syncjobs
    from syncjobs.cli.worker import serve
    from tests.helpers import wait_until

    logging.basicConfig(level=logging.INFO)
    queue = syncjobs.InMemoryJobQueue(workers=1, shutdown_grace=60)
    main = threading.main_thread().ident

    def waiting_in_serve():
        frame = sys._current_frames().get(main)
        return frame is not None and frame.f_code.co_name == "serve"

    def on_ready(stop):
        # The kernel may give a process's signal to any of its threads (it does
        # while the main thread starts one): here, to this one, once serve() waits.
        def take_it():
            wait_until(waiting_in_serve, what="serve() to wait")
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        threading.Thread(target=take_it).start()

    sys.exit(serve([queue], on_ready=on_ready))
    """
)


@pytest.mark.timeout(60)
def test_a_stop_signal_taken_by_another_thread_still_stops_the_worker() -> None:
    proc = _python("-c", SIGNAL_TAKEN_BY_ANOTHER_THREAD)
    _, err = _communicate(proc, WAIT + 20)
    assert proc.returncode == 0, err
    assert "SIGTERM: stopping" in err, err
