"""Tracing export: a run as OpenTelemetry spans, sent over OTLP/HTTP when the run ends.

Off by default. On with ``telemetry.otlp_endpoint`` in the config, or the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` variables (the exporter also reads
``OTEL_EXPORTER_OTLP_HEADERS`` and the rest itself). Needs the optional extra: ``pip install 'overstory[otel]'``;
without it, an enabled export is skipped with one line on stderr.

The span tree is made from the database after the run has ended (``store.spans``), with each row's own
start and end times: the run is the root span (its trace is the run), each turn a child of the run, each
tool call a child of its turn (with its ledger class and status, that is the decision: succeeded, failed,
denied, skipped_duplicate), each approval a child of its turn (requested until decided), each merge a child
of the run. Every span carries ``ov.run_id``, and turn-level ones ``ov.turn_id``. Nothing of this runs
while agents work, so no hot path pays for it.

Delivery: at least once. `ov coordinator stop` and `ov run complete` export before writing the run's
``summary.txt``; a run that ended without one (its process died) is exported again by the watchdog when it
writes the summary.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import typing as t

if t.TYPE_CHECKING:
    from overstory.config.model import Config

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def endpoint(config: Config | None, environ: t.Mapping[str, str] = os.environ) -> str | None:
    """Where spans go; None: tracing is off."""
    configured = config.telemetry.otlp_endpoint if config is not None else None
    if configured:
        return configured
    for name in ENDPOINT_ENVS:
        if environ.get(name):
            return environ[name]
    return None


def export_run(conn: sqlite3.Connection, run_id: str, config: Config | None, *, exporter: t.Any = None) -> int:
    """Send the run's span tree; the number of spans (0 when tracing is off). ``exporter``: tests pass the SDK's
    in-memory one. Raises ImportError without the SDK, sqlite3.Error for an unreadable database."""
    where = endpoint(config)
    if exporter is None and where is None:
        return 0
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from overstory.store import runs, spans

    run = runs.get_run(conn, run_id)
    if run is None:
        return 0
    rows = spans.run_rows(conn, run_id)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # A configured endpoint is the traces URL itself; the variables are read by the exporter (it appends
        # /v1/traces to OTEL_EXPORTER_OTLP_ENDPOINT as the standard says).
        exporter = OTLPSpanExporter(endpoint=config.telemetry.otlp_endpoint) if (
            config is not None and config.telemetry.otlp_endpoint) else OTLPSpanExporter()
    service = config.telemetry.service_name if config is not None else "ov"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    gathered = InMemorySpanExporter()  # the whole tree is sent in one request, not one per span
    provider.add_span_processor(SimpleSpanProcessor(gathered))
    tracer = provider.get_tracer("overstory")
    count = 0

    def span(name: str, start: int | None, end: int | None, parent: t.Any, attributes: dict[str, t.Any]) -> t.Any:
        nonlocal count
        begin = _ns(start) or root_start
        made = tracer.start_span(name, context=trace.set_span_in_context(parent) if parent is not None else None,
                                 start_time=begin, attributes={k: v for k, v in attributes.items() if v is not None})
        count += 1
        return made, max(begin, _ns(end) or begin)

    root_start = _ns(run.started_at) or 0
    root, root_end = span(f"run {run.id}", run.started_at, run.completed_at, None,
                          {"ov.run_id": run.id, "ov.run.status": run.status, "ov.coordinator": run.coordinator})
    turn_spans: dict[str, t.Any] = {}
    ends: list[tuple[t.Any, int]] = []
    for row in rows["turns"]:
        made, end = span(f"turn {row['agent']} #{row['number']}", row["started_at"], row["ended_at"], root,
                         {"ov.run_id": run.id, "ov.turn_id": row["id"], "ov.agent": row["agent"],
                          "ov.turn.attempt": row["attempt"], "ov.turn.status": row["status"], "ov.model": row["model"],
                          "ov.session_id": row["session_id"], "ov.input_tokens": row["input_tokens"],
                          "ov.output_tokens": row["output_tokens"], "ov.cost_usd": row["cost_usd"],
                          "ov.error": row["error"]})
        turn_spans[row["id"]] = made
        ends.append((made, end))
    for row in rows["tool_calls"]:
        parent = turn_spans.get(row["turn_id"], root)
        ends.append(span(f"tool {row['tool']}", row["started_at"], row["ended_at"], parent,
                         {"ov.run_id": run.id, "ov.turn_id": row["turn_id"], "ov.agent": row["agent"],
                          "ov.tool": row["tool"], "ov.ledger.class": row["class"], "ov.ledger.status": row["status"],
                          "ov.ledger.reason": row["reason"], "ov.ledger.flagged": bool(row["flagged"]),
                          "ov.exit_code": row["exit_code"]}))
    for row in rows["approvals"]:
        parent = turn_spans.get(row["turn_id"], root)
        ends.append(span(f"approval {row['id']}", row["requested_at"], row["decided_at"], parent,
                         {"ov.run_id": run.id, "ov.turn_id": row["turn_id"], "ov.agent": row["agent"],
                          "ov.tool": row["tool"], "ov.approval.status": row["status"],
                          "ov.approval.decider": row["decider"], "ov.approval.decided_by": row["decided_by"]}))
    for row in rows["merges"]:
        ends.append(span(f"merge {row['branch']}", row["enqueued_at"], row["processed_at"], root,
                         {"ov.run_id": run.id, "ov.agent": row["agent"], "ov.merge.branch": row["branch"],
                          "ov.merge.target": row["target"], "ov.merge.status": row["status"],
                          "ov.merge.tier": row["tier"]}))
    for made, end in reversed(ends):  # children end before their parents, as they would live
        made.end(end_time=end)
    root.end(end_time=max([root_end, *(end for _, end in ends)]))
    provider.shutdown()
    finished = gathered.get_finished_spans()
    try:
        if exporter.export(finished) != SpanExportResult.SUCCESS:
            raise ConnectionError(f"the collector did not take the {len(finished)} span(s)")
    finally:
        exporter.shutdown()
    return count


def export_run_quietly(conn: sqlite3.Connection, run_id: str, config: Config | None) -> int:
    """``export_run`` that never fails its caller (a run's end): a problem is one line on stderr."""
    if endpoint(config) is None:
        return 0
    try:
        return export_run(conn, run_id, config)
    except ImportError:
        print("ov: tracing is on but the OpenTelemetry SDK is not installed: pip install 'overstory[otel]'",
              file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - an unreachable collector must not fail the run's end
        print(f"ov: could not export run {run_id}'s trace: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def _ns(ms: int | None) -> int | None:
    return None if ms is None else int(ms) * 1_000_000
