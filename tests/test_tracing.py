"""OpenTelemetry tracing (the otel extra), on every backend, with the SDK's in-memory exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import syncjobs
from syncjobs import QueueError
from syncjobs.tracing import TRACE_CONTEXT, Tracing
from tests.cli_jobs import Quick
from tests.conftest import TEST_TABLE, QueueFactory
from tests.helpers import WAIT, Probe, ProbeJob, refuse_label_13
from tests.test_worker_commands import ROOT

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_run_is_a_child_of_its_dispatch_in_the_callers_trace(
    make_queue: QueueFactory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = make_queue()
    Tracing(provider).instrument(queue)
    probe = Probe()
    with queue:
        with provider.get_tracer("app").start_as_current_span("GET /signup") as request:
            handle = queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert TRACE_CONTEXT.get() is None  # nothing left behind in the caller
    (dispatch,) = spans_named(exporter, "dispatch tests.probe")
    (run,) = spans_named(exporter, "run tests.probe")
    trace_id = request.get_span_context().trace_id
    assert dispatch.kind is SpanKind.PRODUCER
    assert dispatch.parent is not None
    assert dispatch.parent.span_id == request.get_span_context().span_id
    assert run.kind is SpanKind.CONSUMER
    assert run.parent is not None
    assert run.parent.span_id == dispatch.context.span_id  # through the W3C trace context that travelled
    assert run.context.trace_id == dispatch.context.trace_id == trace_id
    assert run.attributes is not None
    assert run.attributes["messaging.message.id"] == handle.id
    assert run.attributes["syncjobs.attempt"] == 1
    assert run.status.status_code is not StatusCode.ERROR


def test_each_run_of_a_failing_job_records_its_error_in_the_same_trace(
    make_queue: QueueFactory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = make_queue(1)
    Tracing(provider).instrument(queue)
    probe = Probe("crash", "fatal")
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    (dispatch,) = spans_named(exporter, "dispatch tests.probe")
    runs = sorted(spans_named(exporter, "run tests.probe"), key=lambda span: span.start_time or 0)
    assert [span.attributes["syncjobs.attempt"] for span in runs if span.attributes] == [1, 2]
    for span in runs:
        assert span.parent is not None
        assert span.parent.span_id == dispatch.context.span_id
        assert span.status.status_code is StatusCode.ERROR
        assert [event.name for event in span.events] == ["exception"]
    assert dispatch.parent is None  # no span was current at the dispatch: a trace of its own


def test_a_refused_dispatch_ends_its_span_with_the_error_and_enqueues_nothing(
    make_queue: QueueFactory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = make_queue(0)
    Tracing(provider).instrument(queue)
    queue.around_dispatch(refuse_label_13)
    with pytest.raises(QueueError, match="label 13"):
        queue.dispatch(ProbeJob(Probe().id, label=13))
    with pytest.raises(QueueError, match="delay"):
        queue.dispatch(ProbeJob(Probe().id), delay=-5)  # a check after the payload's, inside the span too
    refused = spans_named(exporter, "dispatch tests.probe")
    assert [span.status.status_code for span in refused] == [StatusCode.ERROR, StatusCode.ERROR]
    assert all([event.name for event in span.events] == ["exception"] for span in refused)
    assert queue.pending_count() == 0
    assert TRACE_CONTEXT.get() is None


def test_a_cancelled_run_ends_its_span_with_an_error(
    make_queue: QueueFactory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = make_queue(1)
    Tracing(provider).instrument(queue)
    with queue:
        queue.dispatch(ProbeJob(Probe("cancel").id))  # raises Cancelled, a BaseException
        assert queue.join(WAIT)
    runs = spans_named(exporter, "run tests.probe")
    assert runs  # each of its runs (one raising Cancelled of itself is run again, as a failure)
    for run in runs:
        assert run.status.status_code is StatusCode.ERROR
        assert [event.name for event in run.events] == ["exception"]
        assert "Cancelled" in (run.status.description or "")


def test_a_twin_made_before_tracing_carries_the_trace_too(
    db_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    first = syncjobs.DatabaseJobQueue(
        db_url, workers=0, table=TEST_TABLE, queue=f"traced-{uuid.uuid4().hex[:8]}", poll_interval=0.2
    )
    first.register(ProbeJob)
    twin = first.for_queue(f"traced-{uuid.uuid4().hex[:8]}", workers=1)
    Tracing(provider).instrument(first)
    try:
        with twin:
            twin.dispatch(ProbeJob(Probe().id))
            assert twin.join(WAIT)
    finally:
        first.shutdown()
    (dispatch,) = spans_named(exporter, "dispatch tests.probe")
    (run,) = spans_named(exporter, "run tests.probe")
    assert run.parent is not None
    assert run.parent.span_id == dispatch.context.span_id


def test_instrumenting_twice_makes_one_span_of_each(
    make_queue: QueueFactory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue = make_queue()
    tracing = Tracing(provider)
    tracing.instrument(queue)
    tracing.instrument(queue)
    with queue:
        queue.dispatch(ProbeJob(Probe().id))
        assert queue.join(WAIT)
    assert len(spans_named(exporter, "dispatch tests.probe")) == 1
    assert len(spans_named(exporter, "run tests.probe")) == 1


@pytest.mark.timeout(90)
def test_a_run_in_another_process_joins_the_dispatchers_trace_through_the_row(
    db_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    queue_name = f"traced-{uuid.uuid4().hex[:8]}"
    producer = syncjobs.DatabaseJobQueue(db_url, workers=0, table=TEST_TABLE, queue=queue_name)
    Tracing(provider).instrument(producer)
    producer.register(Quick)
    with provider.get_tracer("app").start_as_current_span("POST /orders") as request:
        producer.dispatch(Quick(1))
    producer.shutdown()
    done = subprocess.run(
        [sys.executable, "-m", "tests.traced_worker", db_url, TEST_TABLE, queue_name, "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    (run,) = [json.loads(line) for line in done.stdout.splitlines()]
    (dispatch,) = spans_named(exporter, "dispatch cli.quick")
    assert run["name"] == "run cli.quick"
    assert run["trace_id"] == f"{request.get_span_context().trace_id:032x}"
    assert run["parent_span_id"] == f"{dispatch.context.span_id:016x}"
    assert run["status"] != "ERROR"
