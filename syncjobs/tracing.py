"""OpenTelemetry tracing of job queues: the ``otel`` extra (``pip install 'syncjobs[otel]'``).

::

    from syncjobs.tracing import Tracing

    Tracing().instrument(queue)    # the global tracer provider; or Tracing(tracer_provider)

A span for each dispatch (kind PRODUCER, a child of whatever span is current
in the caller, a web request's say) and one for each run (kind CONSUMER), a
child of its dispatch's span. What links them is the W3C trace context
(``traceparent``, ``tracestate``), which travels with the job in the context
variable :data:`TRACE_CONTEXT`: in memory in the job's copied context; on a
database in the row, as a carried variable, so that a run in another process
joins the same trace. A run that fails records its exception on its span.

Only the OpenTelemetry API is needed here; the app configures the SDK and
its exporters, as for any instrumented library. Without an SDK every span
is a no-op.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the extra not installed
    raise ImportError("syncjobs.tracing needs opentelemetry-api: pip install 'syncjobs[otel]'") from exc

from . import __version__
from .context import current_job
from .job import Job

if TYPE_CHECKING:
    from .queue import StoreQueue

#: The W3C trace context of the dispatch a job came from (``{"traceparent": …}``), travelling with the job.
TRACE_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "syncjobs.trace_context", default=None
)

# Always W3C, whatever the app's global propagator: the carrier is syncjobs' own, read only by syncjobs.
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """Spans for the dispatches and runs of the queues given to :meth:`instrument`."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("syncjobs", __version__, tracer_provider=tracer_provider)

    def instrument(self, queue: StoreQueue) -> None:
        """Trace ``queue``'s dispatches and runs from now on, and its twins' (which share its hooks).

        Before any hook that may refuse a dispatch: hooks are entered in the
        order given, and one entered before this one refuses before a span
        begins.
        """
        queue.carry_also(TRACE_CONTEXT)
        queue.around_dispatch(self._dispatch_span)
        queue.wrap_runs(self._run_span)

    @contextlib.contextmanager
    def _dispatch_span(self, job: Job) -> Iterator[None]:
        name = type(job).NAME
        with self._tracer.start_as_current_span(
            f"dispatch {name}",
            kind=trace.SpanKind.PRODUCER,
            attributes={**_SEND, "syncjobs.job.name": name},
            record_exception=False,  # _failed() records any BaseException: Cancelled is one
            set_status_on_exception=False,
        ) as span:
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)  # the dispatch's span, now current
            # Entered while the caller's context is copied: it travels. None rather than {} (no SDK, no
            # span): a job dispatched inside a run must not carry the run's own dispatch as its parent.
            token = TRACE_CONTEXT.set(carrier or None) if carrier or TRACE_CONTEXT.get() is not None else None
            try:
                yield
            except BaseException as exc:
                _failed(span, exc)
                raise
            finally:
                if token is not None:
                    TRACE_CONTEXT.reset(token)

    @contextlib.contextmanager
    def _run_span(self) -> Iterator[None]:
        info = current_job()
        carrier = TRACE_CONTEXT.get()
        parent = None if carrier is None else _PROPAGATOR.extract(carrier)
        name = "job" if info is None else info.name
        attributes: dict[str, str | int] = {**_PROCESS, "syncjobs.job.name": name}
        if info is not None:
            attributes["messaging.message.id"] = info.id
            attributes["syncjobs.attempt"] = info.attempt + 1
        with self._tracer.start_as_current_span(
            f"run {name}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except BaseException as exc:
                _failed(span, exc)
                raise


_SEND = {"messaging.system": "syncjobs", "messaging.operation.type": "send", "messaging.operation.name": "dispatch"}
_PROCESS = {"messaging.system": "syncjobs", "messaging.operation.type": "process", "messaging.operation.name": "run"}


def _failed(span: trace.Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` as its error: a ``BaseException`` too (``Cancelled``, a timeout's)."""
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
