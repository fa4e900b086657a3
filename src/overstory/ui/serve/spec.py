"""Every route of `ov serve`, described once.

The router (``app``), the OpenAPI document (``openapi``) and `ov serve --help` are all
built from ``ENDPOINTS``, so a route cannot exist without its documentation. Plain
data and the standard library: `ov serve --help` reads it without importing Starlette.
"""

from __future__ import annotations

import typing as t


class Param(t.NamedTuple):
    name: str
    where: str  # path | query | header
    type: str  # string | integer | boolean | number
    description: str
    repeat: bool = False


class Endpoint(t.NamedTuple):
    method: str
    path: str
    op: str  # the handler's name in ``routes``, and the OpenAPI operationId
    summary: str
    params: tuple[Param, ...] = ()
    body: str | None = None  # the request model's name in ``bodies``
    status: int = 200
    media: str = "application/json"

    @property
    def changes_state(self) -> bool:
        return self.method not in ("GET", "HEAD")


NAME = Param("name", "path", "string", "agent name")
LIMIT = Param("limit", "query", "integer", "how many (newest first, returned oldest first)")
ALL = Param("all", "query", "boolean", "include completed agents")

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/", "page", "The web page (no token needed: it holds no data). The address `ov serve` prints, "
             "`/#token=T`, signs the page in: the fragment never reaches the server; the page keeps the token in "
             "the tab's sessionStorage and sends it as a header. An older ov's `/?token=T` link answers 410.",
             media="text/html"),
    Endpoint("GET", "/api/docs", "api_docs", "This API, as a readable page (no token needed).", media="text/html"),
    Endpoint("GET", "/api/openapi.json", "openapi", "This API as an OpenAPI 3.1 document (no token needed)."),
    Endpoint("GET", "/api/health", "health", "Liveness: version, project, event cursor, connected stream clients."),
    Endpoint("GET", "/api/status", "status", "The `ov status --json` document.", (ALL,)),
    Endpoint("GET", "/api/agents", "agents", "Every agent, as in `ov status --json` (completed ones with ?all=1).",
             (ALL,)),
    Endpoint("GET", "/api/agents/{name}", "agent", "One agent: its status entry, task, turns, state history, "
             "spend and budget (limit, used and left of each of the four; null when it has none).", (NAME,)),
    Endpoint("GET", "/api/agents/{name}/diff", "agent_diff", "The agent's changes against its base branch "
             "(committed, uncommitted and untracked), as text.",
             (NAME, Param("stat", "query", "boolean", "only the summary (`git diff --stat`)")), media="text/plain"),
    Endpoint("GET", "/api/agents/{name}/mail", "agent_mail", "The agent's conversation: mail to or from it.",
             (NAME, LIMIT)),
    Endpoint("POST", "/api/agents/{name}/stop", "agent_stop", "`ov stop`: settle the agent to completed and stop "
             "its processes.", (NAME,), body="StopBody"),
    Endpoint("POST", "/api/agents/{name}/nudge", "agent_nudge", "`ov nudge`: a high-priority nudge mail.", (NAME,),
             body="NudgeBody", status=201),
    Endpoint("POST", "/api/agents/{name}/resume", "agent_resume", "`ov resume`: raise the agent's limits and "
             "un-park it; it continues the same runtime session.", (NAME,), body="ResumeBody"),
    Endpoint("POST", "/api/sling", "sling", "`ov sling`: spawn an agent (no --spec or --scenario files: "
             "the API reads no file).", body="SlingBody", status=201),
    Endpoint("GET", "/api/events", "events", "Events in id order after a cursor (`ov feed`).", (
        Param("since", "query", "integer", "only events with an id greater than this"),
        Param("agent", "query", "string", "only this agent's events"),
        Param("kind", "query", "string", "only events of this kind (repeatable)", repeat=True),
        Param("turn", "query", "string", "only this turn's events"),
        Param("newest", "query", "boolean", "the newest `limit` events instead of the first after `since`"),
        LIMIT)),
    Endpoint("POST", "/api/events/ticket", "event_ticket", "A ticket for one `GET /events/stream?ticket=...`: "
             "single use, valid for 30 seconds (a browser's EventSource cannot send the token header).",
             body="EmptyBody", status=201),
    Endpoint("GET", "/events/stream", "event_stream", "Server-sent events: every new event as it is committed "
             "(`id:` is the event id). Resume with the `Last-Event-ID` header (browsers send it by themselves) or "
             "?since=N; without either, only new events. A comment line every heartbeat keeps proxies open.", (
                 Param("Last-Event-ID", "header", "integer", "resume after this event id (wins over ?since)"),
                 Param("since", "query", "integer", "resume after this event id"),
                 Param("ticket", "query", "string", "instead of the token: a ticket from POST /api/events/ticket"),
                 Param("agent", "query", "string", "only this agent's events"),
                 Param("kind", "query", "string", "only events of this kind (repeatable)", repeat=True)),
             media="text/event-stream"),
    Endpoint("GET", "/api/mail", "mail_list", "`ov mail list`: mail, oldest first; never marks anything read.", (
        Param("to", "query", "string", "recipient"), Param("from", "query", "string", "sender"),
        Param("type", "query", "string", "mail type"), Param("unread", "query", "boolean", "only unread mail"),
        Param("thread", "query", "integer", "only this thread"), LIMIT)),
    Endpoint("POST", "/api/mail", "mail_send", "`ov mail send` (from the operator unless `from` is given).",
             body="SendBody", status=201),
    Endpoint("GET", "/api/mail/{id}", "mail_get", "One message; never marks it read.",
             (Param("id", "path", "integer", "message id"),)),
    Endpoint("POST", "/api/mail/{id}/reply", "mail_reply", "`ov mail reply`: answer a message, in its thread.",
             (Param("id", "path", "integer", "message id"),), body="ReplyBody", status=201),
    Endpoint("POST", "/api/mail/{id}/read", "mail_read", "Mark a message to the operator read (`ov mail read`).",
             (Param("id", "path", "integer", "message id"),), body="EmptyBody"),
    Endpoint("GET", "/api/runs", "runs", "`ov run list`.", (LIMIT,)),
    Endpoint("GET", "/api/runs/{run}", "run", "`ov run show`: agents, turns, tokens, cost, mail of one run.",
             (Param("run", "path", "string", "run id or a unique prefix of one"),)),
    Endpoint("GET", "/api/merge/queue", "merge_queue", "The merge queue, as `ov merge --all --dry-run` lists it: "
             "announced (reported, not queued yet), pending, failed (with why, until merged or dismissed), then the "
             "latest merged, empty or dismissed."),
    Endpoint("GET", "/api/merge/predict", "merge_predict", "`ov merge --dry-run`: the tier a merge needs and the "
             "files that conflict, touching nothing; with ?all=1, `ov merge --all --dry-run` (the queue predicted "
             "in order, each branch after the ones before it).", (
                 Param("agent", "query", "string", "an agent's branch"), Param("branch", "query", "string",
                                                                               "or a branch"),
                 Param("all", "query", "boolean", "or the whole merge queue, as one sequence"),
                 Param("into", "query", "string", "target branch (default: where the agent was slung from)"))),
    Endpoint("GET", "/api/waiting", "waiting", "What waits for a person, one item per thing: parked agents (with "
             "their park's escalation) and unread questions, escalations, deaths and failed merges addressed to the "
             "operator; an approval's gate mail and park are the approval's item (/api/approvals), and mail about "
             "an agent that has ended, was resumed or slung again since is left out."),
    Endpoint("GET", "/api/approvals", "approvals", "Pending approval gates (`ov approvals`; ?all=true adds "
             "decided ones).",
             (Param("all", "query", "boolean", "decided and expired ones too"),)),
    Endpoint("POST", "/api/approvals/{id}/approve", "approval_approve", "`ov approve`: the agent may run that call "
             "once.", (Param("id", "path", "string", "approval id"),), body="ApproveBody"),
    Endpoint("POST", "/api/approvals/{id}/reject", "approval_reject", "`ov reject`: the agent gets the reason.",
             (Param("id", "path", "string", "approval id"),), body="RejectBody"),
    Endpoint("POST", "/hooks/{name}", "webhook", "Fire the webhook trigger NAME (`ov schedule add NAME --on-webhook`) "
             "once per delivery. It takes the trigger's own secret, not the token: `Authorization: Bearer SECRET`, "
             "or `?secret=SECRET` for senders that cannot set a header (GitHub). A delivery id header "
             "(`X-Delivery-Id`, or GitHub's `X-GitHub-Delivery`) makes it idempotent: a delivery fired before "
             "answers 200 with `duplicate: true` and fires nothing; without one, every POST is a new delivery. "
             "The body is not read. 202 when fired (or held back by the overlap policy or back-off, with "
             "`skipped`), 401 for a wrong secret or an unknown trigger, 409 while paused.", (
                 Param("name", "path", "string", "the schedule's name"),
                 Param("X-Delivery-Id", "header", "string", "the delivery's id (or X-GitHub-Delivery)"),
                 Param("secret", "query", "string", "the trigger's secret, when no Authorization header")),
             status=202),
    Endpoint("GET", "/api/costs", "costs", "`ov costs`: tokens, dollars (real and estimated), turns and tool "
             "calls per group, with totals.", (
        Param("by", "query", "string", "agent, run, capability or model"),
        Param("since", "query", "string", "10m, 2h or an ISO time"))),
)
STATIC_PREFIX = "/static"


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def help_text() -> str:
    """The route list for `ov serve --help` (click's ``\\b`` keeps the lines as they are)."""
    lines = ["\b", "Every route but the page, its files, the docs and /hooks/NAME needs the token:",
             "`Authorization: Bearer <.overstory/serve-token>` (the stream also takes a one-use ticket).",
             "No cookie carries it. POSTs naming a foreign Origin are refused.", "", "\b", "Routes:"]
    width = max(len(e.path) for e in ENDPOINTS) + 2
    for endpoint in ENDPOINTS:
        lines.append(f"  {endpoint.method:<5}{endpoint.path:<{width}}{_first_sentence(endpoint.summary)}")
    lines.append(f"  GET  {STATIC_PREFIX + '/...':<{width}}The page's files.")
    lines += ["", "\b", "Full descriptions, parameters and bodies: /api/docs and /api/openapi.json on the server."]
    return "\n".join(lines)
