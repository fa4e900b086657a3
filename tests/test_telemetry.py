"""Tracing export (overstory/project/telemetry.py): a run's span tree, in memory and over real OTLP/HTTP."""

from __future__ import annotations

import http.server
import json
import threading
import typing as t
from pathlib import Path

import pytest

from agent_helpers import wait_for, wait_terminal
from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store import runs, sessions
from overstory.store.db import open_state
from test_coordinator import READY, scenario, team, write_local_config  # noqa: F401 - fixture

pytest.importorskip("opentelemetry.sdk", reason="the optional extra `otel`")

GATED = "echo gated"
BUILDER = [
    {"actions": [{"write": {"path": "work/notes.md", "content": "notes\n"}},
                 {"bash": "git add work/notes.md && git commit -qm notes"},
                 {"bash": GATED}], "result": "waiting for approval"},
    {"actions": [{"bash": GATED},
                 {"bash": "ov mail send --type worker_done --subject done --body finished"}], "result": "done"},
]


def test_a_scripted_run_becomes_one_span_tree(team: ProjectPaths, tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from overstory.project.telemetry import export_run

    write_local_config(team, runtime={"default": "scripted"}, turns={"retry_backoff": 0.05, "kill_grace": 1},
                       approvals={"rules": [{"match": f"Bash({GATED}*)", "reason": "a gate for the trace"}]})
    path = scenario(tmp_path / "s.json", {"coordinator": READY, "builder-*": BUILDER})
    started = run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    slung = run_ov("sling", "builder", "notes", "--name", "builder-notes", "--runtime", "scripted",
                   "--scenario", str(path), cwd=team.root)
    assert slung.returncode == 0, slung.stderr

    def waiting() -> str | None:
        conn = open_state(team.state_db)
        try:
            row = conn.execute("SELECT id FROM approvals WHERE agent = 'builder-notes' AND status = 'pending'").fetchone()
            return row["id"] if row else None
        finally:
            conn.close()

    approval_id = wait_for(waiting, 60, message="the gate")
    approved = run_ov("approve", approval_id, cwd=team.root)
    assert approved.returncode == 0, approved.stderr
    assert wait_terminal(team, "builder-notes").state == "completed"
    merged = run_ov("merge", "--all", "--json", cwd=team.root)
    assert merged.returncode == 0, merged.stderr
    assert run_ov("coordinator", "stop", cwd=team.root).returncode == 0

    exporter = InMemorySpanExporter()
    conn = open_state(team.state_db)
    try:
        count = export_run(conn, run_id, None, exporter=exporter)
    finally:
        conn.close()
    found = exporter.get_finished_spans()
    assert count == len(found)
    by_id = {span.context.span_id: span for span in found}
    root = next(span for span in found if span.parent is None)
    assert root.name == f"run {run_id}" and root.attributes["ov.run.status"] == "completed"
    assert {span.context.trace_id for span in found} == {root.context.trace_id}, "one trace: the run"

    def parent(span: t.Any) -> t.Any:
        return by_id[span.parent.span_id]

    turns = sorted((s for s in found if s.name.startswith("turn builder-notes")), key=lambda s: s.start_time)
    assert len(turns) == 2 and all(parent(s) is root for s in turns)
    assert [s.attributes["ov.turn.status"] for s in turns] == ["ok", "ok"]
    tools = [s for s in found if s.name == "tool Bash" and s.attributes["ov.agent"] == "builder-notes"]
    assert all(parent(s) in turns for s in tools)
    # Each call with its ledger class and decision: the gated call refused in turn 1, run once approved in turn 2.
    assert sorted((parent(s) is turns[1], s.attributes["ov.ledger.class"], s.attributes["ov.ledger.status"])
                  for s in tools) == [(False, "local_write", "succeeded"), (False, "read", "denied"),
                                      (True, "read", "succeeded"), (True, "side_effect", "succeeded")]
    gate = next(s for s in found if s.name == f"approval {approval_id}")
    assert parent(gate) is turns[0] and gate.attributes["ov.approval.status"] == "approved"
    merge = next(s for s in found if s.name.startswith("merge "))
    assert parent(merge) is root and merge.attributes["ov.merge.status"] == "merged"
    assert all(s.attributes["ov.run_id"] == run_id for s in found)
    assert all(root.start_time <= s.start_time <= s.end_time for s in found)


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: t.ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: t.Any) -> None:
        pass


def test_off_by_default_and_sent_over_otlp_http_when_an_endpoint_is_set(project: ProjectPaths,
                                                                        state_db: t.Any) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.bodies = []
    try:
        for n in (1, 2):
            run, _ = runs.open_or_join(state_db, "coordinator")
            sessions.create_session(state_db, name=f"coordinator-{n}", capability="coordinator", task_id="c",
                                    runtime="scripted", actor="test", parent="operator", depth=0, run_id=run.id)
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}"} if n == 2 else {}
            done = run_ov("run", "complete", run.id, "--force", cwd=project.root, env=env)
            assert done.returncode == 0, done.stderr
            if n == 1:
                assert _Receiver.bodies == [], "off by default"
        assert [p for p, _ in _Receiver.bodies] == ["/v1/traces"]
        request = ExportTraceServiceRequest.FromString(_Receiver.bodies[0][1])
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        assert [s.name for s in spans] == [f"run {run.id}"]
        service = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
        assert service["service.name"] == "ov"
        # A collector that does not answer: one line on stderr, and the run's end goes on (its summary is written).
        closed = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
        port = closed.server_port
        closed.server_close()
        run, _ = runs.open_or_join(state_db, "coordinator")
        sessions.create_session(state_db, name="coordinator-3", capability="coordinator", task_id="c",
                                runtime="scripted", actor="test", parent="operator", depth=0, run_id=run.id)
        done = run_ov("run", "complete", run.id, "--force", cwd=project.root,
                      env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"})
        assert done.returncode == 0, done.stderr
        assert f"ov: could not export run {run.id}'s trace" in done.stderr and "Traceback" not in done.stderr
        assert (project.ov_dir / "runs" / run.id / "summary.txt").exists()
    finally:
        server.shutdown()
