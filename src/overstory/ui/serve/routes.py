"""Route handlers: read the request, call the core function the CLI calls, answer JSON.

No decisions live here. The work runs in a worker thread with its own database
connections (``Core``), opened for the request and closed after it, so the server
holds no lock between requests and does not mind agents, loops or the watchdog
restarting around it. Errors are ov's own (``OrchestratorError``); ``app`` answers each
with its class's ``http_status`` (``errors``).
"""

from __future__ import annotations

import os
import sqlite3
import typing as t
from pathlib import Path

from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse

from overstory import __version__
from overstory.errors import NotFound, UsageError, WebhookRefused
from overstory.names import validate_name
from overstory.paths import ProjectPaths
from overstory.ui.serve import bodies, openapi
from overstory.ui.serve import events as live
from overstory.views import documents as views
from overstory.views import status

if t.TYPE_CHECKING:
    from overstory.config.model import Config

STATIC_DIR = Path(__file__).resolve().parent / "static"
OPERATOR = "operator"
T = t.TypeVar("T")


class Core:
    """A request's view of the project: connections and config, opened on first use on the worker thread."""

    def __init__(self, project: ProjectPaths) -> None:
        self.project = project
        self._state: sqlite3.Connection | None = None
        self._config: Config | None = None

    @property
    def state(self) -> sqlite3.Connection:
        if self._state is None:
            from overstory.store.db import open_state

            self._state = open_state(self.project.state_db)
        return self._state

    @property
    def config(self) -> Config:
        if self._config is None:
            from overstory.config.load import load as load_config

            self._config = load_config(self.project.config_file, self.project.local_config_file)
        return self._config

    def close(self) -> None:
        if self._state is not None:
            self._state.close()


async def run(request: Request, work: t.Callable[[Core], T]) -> T:
    project: ProjectPaths = request.app.state.project

    def call() -> T:
        core = Core(project)
        try:
            return work(core)
        finally:
            core.close()

    return await run_in_threadpool(call)


# ---- reading the request -------------------------------------------------------------------


def _int(request: Request, name: str, default: int | None = None, *, high: int | None = None) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"?{name} must be a whole number, not {text!r}") from None
    if value < 0 or (high is not None and value > high):
        raise UsageError(f"?{name} must be between 0 and {high if high is not None else 'any'}")
    return value


def _flag(request: Request, name: str) -> bool:
    text = request.query_params.get(name, "").lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise UsageError(f"?{name} must be 1/true/yes or 0/false/no, not {text!r}")


def _text(request: Request, name: str) -> str | None:
    return request.query_params.get(name) or None


def _name(request: Request) -> str:
    return validate_name(request.path_params["name"], "agent name")


def _message_id(request: Request) -> int:
    text = request.path_params["id"]
    if not text.isdigit():
        raise UsageError(f"a message id is a whole number, not {text!r}")
    return int(text)


async def _body(request: Request, model: type[bodies.Model]) -> bodies.Model:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > bodies.MAX_BODY_BYTES:
            break
    return bodies.parse(bytes(raw), request.headers.get("content-type"), model)


def _json(document: t.Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(document, status_code=status_code)


# ---- the page and the docs -------------------------------------------------------------------


async def page(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


async def api_docs(request: Request) -> Response:
    return HTMLResponse(openapi.docs_page())


async def openapi_document(request: Request) -> Response:
    return _json(openapi.document())


async def health(request: Request) -> Response:
    hub: live.EventHub = request.app.state.hub
    return _json({"ok": True, "version": __version__, "project": str(request.app.state.project.root),
                  "events_cursor": hub.cursor, "stream_clients": len(hub.subscribers)})


# ---- agents -------------------------------------------------------------------------------------


async def status_document(request: Request) -> Response:
    everyone = _flag(request, "all")
    return _json(await run(request, lambda c: status.collect(c.state, include_completed=everyone)))


async def agents(request: Request) -> Response:
    everyone = _flag(request, "all")
    return _json(await run(request, lambda c: status.collect(c.state, include_completed=everyone)["agents"]))


async def agent(request: Request) -> Response:
    name = _name(request)
    from overstory.store.budgets import agent_budget

    def work(c: Core) -> dict[str, t.Any]:
        return {**views.agent_detail(c.state, name), "budget": agent_budget(c.state, name)}

    return _json(await run(request, work))


async def agent_diff(request: Request) -> Response:
    from overstory.views.diffs import agent_diff as diff_of

    name, stat = _name(request), _flag(request, "stat")
    return PlainTextResponse(await run(request, lambda c: diff_of(c.project, c.state, name, stat=stat)))


async def agent_mail(request: Request) -> Response:
    name, limit = _name(request), _int(request, "limit", 50, high=1000)
    return _json(await run(request, lambda c: views.agent_mail(c.state, name, limit=limit or 50)))


async def agent_stop(request: Request) -> Response:
    from overstory.agents.stop import stop_agent

    name, body = _name(request), await _body(request, bodies.StopBody)
    return _json(await run(request, lambda c: stop_agent(
        c.project, c.state, name, force=body.force, clean=body.clean, kill_grace=c.config.turns.kill_grace,
        fallback_base=c.config.project.canonical_branch).as_dict()))


async def agent_nudge(request: Request) -> Response:
    from overstory.agents.nudge import nudge

    name, body = _name(request), await _body(request, bodies.NudgeBody)
    return _json(await run(request, lambda c: nudge(c.project, c.state, name, body.message, sender=OPERATOR,
                                                    force=True).as_dict()), 201)  # a person asked: always sent


async def agent_resume(request: Request) -> Response:
    from overstory.agents.budgeting import resume_from_request as resume

    name, body = _name(request), await _body(request, bodies.ResumeBody)
    return _json(await run(request, lambda c: resume(c.project, c.config, c.state, name, add_usd=body.add_usd,
                                                     add_turns=body.add_turns, add_time=body.add_time)))


async def sling(request: Request) -> Response:
    from overstory.agents.spawn import sling as spawn
    from overstory.wire import SlingRequest

    body = await _body(request, bodies.SlingBody)
    wanted = SlingRequest(**body.model_dump())  # the API's body is a part of the request (its schema: bodies)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}
    return _json(await run(request, lambda c: spawn(c.project, c.config, c.state, wanted, environ).as_dict()), 201)


# ---- events -------------------------------------------------------------------------------------


async def events(request: Request) -> Response:
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    since, limit = _int(request, "since", 0), _int(request, "limit", 200, high=5000)
    agent_name, turn, kinds, newest = (_text(request, "agent"), _text(request, "turn"),
                                       request.query_params.getlist("kind"), _flag(request, "newest"))

    def work(c: Core) -> dict[str, t.Any]:
        conn = open_events(c.project.events_db)
        try:
            found = event_store.query(conn, agent=agent_name, kinds=kinds or None, turn_id=turn, after_id=since or 0,
                                      limit=limit or 200, newest=newest)
        finally:
            conn.close()
        return {"events": [e.as_dict() for e in found], "last_id": found[-1].id if found else since}

    return _json(await run(request, work))


async def event_ticket(request: Request) -> Response:
    """A single-use ticket for ``GET /events/stream?ticket=...`` (a browser's EventSource sends no header)."""
    await _body(request, bodies.EmptyBody)
    tickets = request.app.state.tickets
    return _json({"ticket": tickets.issue(), "expires_in": tickets.seconds}, status_code=201)


async def event_stream(request: Request) -> Response:
    header = request.headers.get("last-event-id")
    if header is not None and header.strip():
        if not header.strip().isdigit():
            raise UsageError(f"Last-Event-ID must be an event id (a whole number), not {header!r}")
        after: int | None = int(header)
    else:
        after = _int(request, "since")
    agent_name, kinds = _text(request, "agent"), request.query_params.getlist("kind")
    hub: live.EventHub = request.app.state.hub
    subscriber = hub.subscribe()  # before reading where to start, so nothing committed in between is missed
    start = await hub.newest() if after is None else after
    body = live.stream(hub, subscriber, after=start, catch_up=after is not None, agent=agent_name, kinds=kinds,
                       heartbeat=request.app.state.heartbeat)
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"},
                             background=BackgroundTask(hub.unsubscribe, subscriber))


# ---- mail ----------------------------------------------------------------------------------------


async def mail_list(request: Request) -> Response:
    from overstory.store import mail

    filters = {"to": _text(request, "to"), "sender": _text(request, "from"), "type": _text(request, "type"),
               "unread": _flag(request, "unread"), "thread": _int(request, "thread"),
               "limit": _int(request, "limit", 50, high=5000)}
    return _json(await run(request, lambda c: [m.as_dict() for m in mail.list_messages(c.state, **filters)]))


async def mail_send(request: Request) -> Response:
    from overstory.store import mail

    body = await _body(request, bodies.SendBody)
    return _json({"ids": await run(request, lambda c: mail.send(
        c.state, sender=body.sender or OPERATOR, to=body.to, subject=body.subject, body=body.body, type=body.type,
        priority=body.priority, payload=body.payload, reply_to=body.reply_to, allow_unknown=body.allow_unknown,
        dedup_key=body.dedup_key, env={}))}, 201)


async def mail_get(request: Request) -> Response:
    from overstory.store import mail

    message_id = _message_id(request)

    def work(c: Core) -> dict[str, t.Any]:
        message = mail.get(c.state, message_id)
        if message is None:
            raise NotFound(f"no message #{message_id}")
        return message.as_dict()

    return _json(await run(request, work))


async def mail_reply(request: Request) -> Response:
    from overstory.store import mail

    message_id, body = _message_id(request), await _body(request, bodies.ReplyBody)
    new_id = await run(request, lambda c: mail.reply(c.state, message_id, sender=body.sender or OPERATOR,
                                                     body=body.body, subject=body.subject, env={}))
    return _json({"id": new_id, "reply_to": message_id}, 201)


async def mail_read(request: Request) -> Response:
    from overstory.store import mail

    message_id = _message_id(request)
    await _body(request, bodies.EmptyBody)
    return _json(await run(request, lambda c: mail.read_message(c.state, message_id, reader=OPERATOR).as_dict()))


# ---- runs, merges, what waits ------------------------------------------------------------------------


async def runs(request: Request) -> Response:
    from overstory.store import runs as run_store

    limit = _int(request, "limit", 50, high=1000)
    return _json(await run(request, lambda c: run_store.list_runs(c.state, limit=limit)))


async def run_report(request: Request) -> Response:
    from overstory.store import runs as run_store

    ref = request.path_params["run"]
    return _json(await run(request, lambda c: run_store.report(c.state, run_store.resolve(c.state, ref))))


async def merge_queue(request: Request) -> Response:
    from overstory.merge.queue import queue_view

    return _json(await run(request, lambda c: queue_view(c.project, c.state, c.config)))


async def merge_predict(request: Request) -> Response:
    from overstory.merge.queue import merge_all, merge_one

    agent_name, branch, into = _text(request, "agent"), _text(request, "branch"), _text(request, "into")
    if _flag(request, "all") and agent_name is None and branch is None:  # the queue, as one sequence
        return _json(await run(request, lambda c: _dry_run_all(merge_all(c.project, c.config, c.state, into=into,
                                                                         dry_run=True))))
    if (agent_name is None) == (branch is None):
        raise UsageError("name exactly one of ?agent=NAME, ?branch=B or ?all=1")
    return _json(await run(request, lambda c: merge_one(c.project, c.config, c.state, agent_name=agent_name,
                                                        branch=branch, into=into, dry_run=True).as_dict()))


def _dry_run_all(run: t.Any) -> dict[str, t.Any]:
    return {"merges": [r.as_dict() for r in run.reports], "skipped": [s.as_dict() for s in run.skipped]}


async def waiting(request: Request) -> Response:
    return _json(await run(request, lambda c: views.waiting(c.state)))


async def approvals(request: Request) -> Response:
    from overstory.agents.approvals import list_approvals as listing

    everything = _flag(request, "all")
    return _json(await run(request, lambda c: listing(c.project, c.state, include_decided=everything)))


async def approval_approve(request: Request) -> Response:
    from overstory.agents.approvals import approve

    approval_id, body = request.path_params["id"], await _body(request, bodies.ApproveBody)
    return _json(await run(request, lambda c: approve(c.project, c.state, approval_id, decider=OPERATOR,
                                                      note=body.note)))


async def approval_reject(request: Request) -> Response:
    from overstory.agents.approvals import reject

    approval_id, body = request.path_params["id"], await _body(request, bodies.RejectBody)
    return _json(await run(request, lambda c: reject(c.project, c.state, approval_id, decider=OPERATOR,
                                                     reason=body.reason)))


async def costs(request: Request) -> Response:
    from overstory.views.costs import costs_report as report

    by, since = _text(request, "by"), _text(request, "since")
    return _json(await run(request, lambda c: report(c.project, c.state, by=by, since=since)))


async def webhook(request: Request) -> Response:
    """POST /hooks/{name}: ``scheduler.receive_webhook`` decides (the secret, the delivery, the fire)."""
    from overstory.scheduling.scheduler import DELIVERY_HEADERS, receive_webhook

    name = request.path_params["name"]
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    secret = credential.strip() if scheme.lower() == "bearer" else request.query_params.get("secret")
    delivery = next((request.headers[h] for h in DELIVERY_HEADERS if h in request.headers), None)
    try:
        result = await run(request, lambda c: receive_webhook(c.project, c.state, name, secret, delivery))
    except WebhookRefused as exc:
        return JSONResponse({"error": str(exc)}, status_code=401, headers={"www-authenticate": 'Bearer realm="ov hooks"'})
    return _json(result, 200 if result.get("duplicate") else 202)


HANDLERS: dict[str, t.Callable[[Request], t.Awaitable[Response]]] = {
    "page": page, "api_docs": api_docs, "openapi": openapi_document, "health": health, "status": status_document,
    "agents": agents, "agent": agent, "agent_diff": agent_diff, "agent_mail": agent_mail, "agent_stop": agent_stop,
    "agent_nudge": agent_nudge, "agent_resume": agent_resume, "sling": sling, "events": events,
    "event_ticket": event_ticket, "event_stream": event_stream, "mail_list": mail_list, "mail_send": mail_send,
    "mail_get": mail_get,
    "mail_reply": mail_reply, "mail_read": mail_read, "runs": runs, "run": run_report, "merge_queue": merge_queue,
    "merge_predict": merge_predict, "waiting": waiting, "approvals": approvals,
    "approval_approve": approval_approve, "approval_reject": approval_reject, "costs": costs,
    "webhook": webhook,
}
