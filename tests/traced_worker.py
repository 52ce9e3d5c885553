"""``python -m tests.traced_worker URL TABLE QUEUE RUNS``: run a queue's jobs with tracing, print the run spans.

A worker in a process of its own, whose tracer exports to memory: once RUNS
run spans have ended (or 30 s have passed) it prints each as a JSON line
(name, trace and span ids in hex, the parent's span id, the status) and exits.
"""

from __future__ import annotations

import json
import sys
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import syncjobs
from syncjobs.tracing import Tracing
from tests.cli_jobs import Quick


def main(url: str, table: str, queue_name: str, runs: int) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = syncjobs.DatabaseJobQueue(url, workers=1, table=table, queue=queue_name, poll_interval=0.2)
    queue.register(Quick)
    Tracing(provider).instrument(queue)
    deadline = time.monotonic() + 30
    with queue:
        while len(exporter.get_finished_spans()) < runs and time.monotonic() < deadline:
            queue.wait_finished(0.5)
    for span in exporter.get_finished_spans():
        parent = span.parent
        line = {
            "name": span.name,
            "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent_span_id": None if parent is None else f"{parent.span_id:016x}",
            "status": span.status.status_code.name,
        }
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
