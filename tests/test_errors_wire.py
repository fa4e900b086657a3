"""Errors that carry their data, and one wire shape per request (issue 29, STYLE.md §10).

Every error class of ov is in ``errors.py`` and knows how each boundary answers it: the CLI's
exit code, `ov serve`'s HTTP status, an agent endpoint's HTTP status. The table below is the
contract, written out (not read from the code it checks). A sling request is one dataclass:
what the CLI sends is what the endpoint's route reads, and anything else is refused with a
one-line usage error (HTTP 400, exit 2) through the real endpoint on a real unix socket. The
same for a merge request.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import typing as t
from pathlib import Path

import pytest

from conftest import ov_command, run_git
from overstory import errors
from overstory.cli.hot import error_kind
from overstory.endpoint.client import ENDPOINT_ENV, TOKEN_ENV, Channel, unix_address
from overstory.endpoint.routes import ROUTES
from overstory.endpoint.server import AgentEndpoint
from overstory.errors import EndpointError, UsageError
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_state
from overstory.wire import MergeRequest, SlingRequest, StopRequest
from test_endpoint import agent_row

SRC = Path(__file__).resolve().parent.parent / "src" / "overstory"
LISTS = "; `ov status --all` lists them"

# class name: (constructor arguments, exit code, `ov serve` status, endpoint status, message)
ERRORS: dict[str, tuple[tuple[t.Any, ...], int, int, int, str]] = {
    "OrchestratorError": (("refused",), 1, 409, 400, "refused"),
    "UsageError": (("bad option",), 2, 400, 400, "bad option"),
    "NotFound": (("no message #3",), 1, 404, 400, "no message #3"),
    "NotAGitRepository": (("x",), 1, 409, 400, "x"),
    "ProjectNotFound": (("x",), 1, 409, 400, "x"),
    "AlreadyInitialized": (("x",), 1, 409, 400, "x"),
    "ConfigError": (("x",), 1, 409, 400, "x"),
    "InvalidName": (("x",), 2, 400, 400, "x"),
    "AgentNotFound": (("buidler-1", ["builder-1"]), 1, 404, 400,
                      "no agent named 'buidler-1' (did you mean 'builder-1'?)" + LISTS),
    "CoordinatorNotRunning": ((), 1, 404, 400, "no coordinator is running; start one with `ov coordinator start`"),
    "RunNotFound": (("no run 'run-1'",), 1, 404, 400, "no run 'run-1'"),
    "AgentExists": (("x",), 1, 409, 400, "x"),
    "GroupNotFound": (("atuh", ["auth"]), 1, 404, 400, "no group named 'atuh' (did you mean 'auth'?); `ov group "
                      "list` lists them, `ov group create NAME` makes one"),
    "GroupExists": (("auth",), 1, 409, 400, "a group named 'auth' exists already; add agents to it with "
                    "`ov group add auth AGENT`"),
    "CoordinatorRunning": (("coordinator", "working", None), 1, 409, 400,
                           "a coordinator is already running (coordinator, working, run -); mail it with "
                           "`ov coordinator send`, or stop it first with `ov coordinator stop`"),
    "RunStillActive": (("x",), 1, 409, 400, "x"),
    "NoReply": (("no answer", 3), 3, 409, 400, "no answer"),
    "BudgetExhausted": (("x",), 1, 409, 400, "x"),
    "ApprovalError": (("x",), 1, 409, 400, "x"),
    "DiffError": (("x",), 1, 409, 400, "x"),
    "TokenError": (("x",), 1, 409, 400, "x"),
    "BadBody": (("too big", 413), 2, 413, 400, "too big"),
    "MailError": (("x",), 1, 409, 400, "x"),
    "PayloadError": (("x",), 1, 409, 400, "x"),
    "SpawnError": (("x",), 1, 409, 400, "x"),
    "GuardDenied": (("x",), 1, 409, 400, "x"),
    "RuntimeNotAvailable": (("x",), 1, 409, 400, "x"),
    "LockHeld": (("x",), 1, 409, 400, "x"),
    "MergeError": (("x",), 1, 409, 400, "x"),
    "HierarchyError": (("x",), 1, 409, 400, "x"),
    "TmuxError": (("x",), 1, 409, 400, "x"),
    "StoreError": (("x",), 1, 503, 400, "x"),
    "DiskFull": (("x",), 1, 503, 400, "x"),
    "UnknownCapability": (("x",), 2, 400, 400, "x"),
    "OverlayError": (("x",), 1, 409, 400, "x"),
    "CleanRefused": (("x",), 1, 409, 400, "x"),
    "SandboxError": (("x",), 1, 409, 400, "x"),
    "EndpointError": (("x",), 1, 409, 400, "x"),
    "NotPermitted": (("builder-a may not",), 1, 403, 403, "builder-a may not"),
    "LoopError": (("x",), 1, 409, 400, "x"),
    "ScheduleError": (("x",), 1, 409, 400, "x"),
    "WebhookRefused": (("x",), 1, 401, 400, "x"),
    "ExecutorError": (("x",), 1, 409, 400, "x"),
    "ExecutorUnavailable": (("ray", "not installed", "pip install 'overstory[ray]'"), 1, 409, 400,
                            "executor 'ray': not installed (pip install 'overstory[ray]')"),
    "ClusterUnreachable": (("ray://h:10001", "refused"), 1, 409, 400,
                           "cannot reach the Ray cluster at ray://h:10001: refused"),
    "TurnNotFound": (("t-9", "local"), 1, 409, 400, "turn t-9 is not known to the local executor"),
    "TurnStillRunning": (("t-9", "ray", "running"), 1, 409, 400, "turn t-9 is still running on the ray executor "
                         "after a stop"),
    "WorkspaceRefused": (("t-9", "no workspace was sent out for this turn"), 1, 409, 409,
                         "turn t-9: no workspace was sent out for this turn"),
}


def _error_classes() -> dict[str, type[errors.OrchestratorError]]:
    return {name: value for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, errors.OrchestratorError)}


def test_every_error_class_has_its_row_in_the_table() -> None:
    assert sorted(_error_classes()) == sorted(ERRORS), "a new error class needs its row (exit code, statuses)"


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_an_error_class_knows_its_exit_code_its_statuses_and_its_message(name: str) -> None:
    args, exit_code, http_status, endpoint_status, message = ERRORS[name]
    error = getattr(errors, name)(*args)
    assert (error.exit_code, error.http_status, error.endpoint_status, str(error)) == (
        exit_code, http_status, endpoint_status, message)


def test_agent_not_found_builds_its_message_from_its_data() -> None:
    plain = errors.AgentNotFound("nobody")
    assert (plain.name, plain.similar, str(plain)) == ("nobody", (), "no agent named 'nobody'" + LISTS)
    assert str(errors.AgentNotFound("leed-1", ["lead-1", "lead-2"], option="--parent")) == (
        "--parent: no agent named 'leed-1' (did you mean 'lead-1' or 'lead-2'?)" + LISTS)
    assert str(errors.AgentNotFound("x", detail="and no events from it", hint="`ov status --all` lists agents")) == (
        "no agent named 'x' and no events from it; `ov status --all` lists agents")
    assert str(errors.AgentNotFound("x", hint="")) == "no agent named 'x'"
    assert error_kind(errors.AgentNotFound("x")) == "agent_not_found"  # --json's kind: the class name, unchanged
    assert error_kind(errors.CoordinatorNotRunning()) == "coordinator_not_running"


def test_agent_not_found_from_the_database_offers_the_close_names(project: ProjectPaths, state_db: t.Any) -> None:
    for name in ("builder-green", "builder-greet", "scout-1"):
        agent_row(state_db, project, name, "builder")
    error = sessions.agent_not_found(state_db, "builder-gren")
    assert isinstance(error, errors.AgentNotFound) and error.name == "builder-gren"
    assert error.similar == ("builder-green", "builder-greet")
    assert str(error) == "no agent named 'builder-gren' (did you mean 'builder-green' or 'builder-greet'?)" + LISTS
    assert sessions.no_agent_named(state_db, "zzz") == "no agent named 'zzz'"


def test_no_error_class_is_defined_outside_errors_py() -> None:
    """Classes deriving from ov's errors live in errors.py; private control-flow exceptions may stay local."""
    names = set(_error_classes())
    outside = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases}
                if bases & names:
                    outside.append(f"{path.relative_to(SRC)}: {node.name}")
    assert outside == []


# ---- one wire shape ---------------------------------------------------------------------------------


def test_a_sling_request_round_trips_through_its_wire_shape(tmp_path: Path) -> None:
    full = SlingRequest(capability="builder", task_id="t-1", name="b-1", prompt="do it", files=("a.py", "b.py"),
                        parent="lead-1", runtime="scripted", model="sonnet", base_branch="dev",
                        scenario_text="turns: []\n", scenario_name="plan.yaml", tmux=False,
                        budget={"max_usd": 2.5, "max_turns": 3, "max_tool_calls": None, "max_wallclock": 60.0},
                        approve=("Bash(git push*)",), group="auth")
    wire = full.to_wire()
    assert set(wire) == set(SlingRequest.WIRE)
    assert json.loads(json.dumps(wire)) == wire  # plain JSON
    assert SlingRequest.from_wire(json.loads(json.dumps(wire))) == full
    least = SlingRequest(capability="scout", task_id="look")
    assert SlingRequest.from_wire(least.to_wire()) == least
    assert SlingRequest.from_wire({"capability": "scout", "task_id": "look"}) == least  # null or absent: not given

    spec, plan = tmp_path / "spec.md", tmp_path / "plan.yaml"
    spec.write_text("from the spec\n")
    plan.write_text("turns: []\n")
    local = SlingRequest(capability="builder", task_id="t", spec_file=spec, scenario=plan)
    with pytest.raises(ValueError, match="spec_file, scenario"):
        local.to_wire()  # files are read on the caller's side first, never sent as paths
    sent = SlingRequest.from_wire(local.read_files().to_wire())
    assert (sent.prompt, sent.scenario_text, sent.scenario_name) == ("from the spec\n", "turns: []\n", str(plan))
    with pytest.raises(UsageError, match=r"^cannot read --spec .*missing\.md: No such file"):
        SlingRequest(capability="builder", task_id="t", spec_file=tmp_path / "missing.md").read_files()


def test_a_merge_request_round_trips_through_its_wire_shape() -> None:
    full = MergeRequest(agent="builder-a", into="main", dry_run=True, tier_max=2, force=True)
    assert MergeRequest.from_wire(json.loads(json.dumps(full.to_wire()))) == full
    assert set(full.to_wire()) == {"agent", "branch", "all", "into", "dry_run", "tier_max", "force"}
    assert MergeRequest.from_wire({"branch": "ov/x", "all": None}) == MergeRequest(branch="ov/x")
    with pytest.raises(ValueError, match="allow_protected"):
        MergeRequest(agent="a", allow_protected=True).to_wire()  # the operator's decision never travels
    for document, problem in [({"agent": "a", "allow_protected": True}, "merge: unknown field 'allow_protected'"),
                              ({"agent": "a", "dry_run": "yes"}, "merge: dry_run must be true or false, not a string"),
                              ({"agent": "a", "tier_max": -1}, "merge: tier_max must be a whole number >= 0"),
                              ({"agent": ["a"]}, "merge: agent must be a string, not a list"),
                              ("builder-a", "merge: the request must be a JSON object, not a string")]:
        with pytest.raises(UsageError, match=f"^{problem}"):
            MergeRequest.from_wire(document)


def test_a_stop_request_round_trips_through_its_wire_shape() -> None:
    request = StopRequest("builder-a", force=True, clean=True)
    assert StopRequest.from_wire(json.loads(json.dumps(request.to_wire()))) == request
    assert StopRequest.from_wire({"agent": "b", "force": None}) == StopRequest("b")
    for document, problem in [({"force": True}, "stop: missing field 'agent'"),
                              ({"agent": "b", "clean": 1}, "stop: clean must be true or false, not a number"),
                              ({"agent": "b", "grace": 3}, "stop: unknown field 'grace'")]:
        with pytest.raises(UsageError, match=f"^{problem}$"):
            StopRequest.from_wire(document)


BAD_WIRE = [
    ({"capability": "builder", "task_id": "t", "bogus": 1}, "sling: unknown field 'bogus'"),
    ({"capability": "builder"}, "sling: missing field 'task_id'"),
    ({"task_id": "t", "capability": None}, "sling: missing field 'capability'"),
    ({"capability": "builder", "task_id": 7}, "sling: task_id must be a string, not a number"),
    ({"capability": "builder", "task_id": "t", "files": "a.py"}, "sling: files must be a list of strings, not a string"),
    ({"capability": "builder", "task_id": "t", "files": ["a.py", 3]}, "sling: files must be a list of strings"),
    ({"capability": "builder", "task_id": "t", "tmux": "yes"}, "sling: tmux must be true or false, not a string"),
    ({"capability": "builder", "task_id": "t", "budget": {"max_usd": -1}}, "budget: max_usd must be a number >= 0"),
    ({"capability": "builder", "task_id": "t", "budget": {"usd": 1}}, "budget: expected an object with keys"),
    ({"capability": "builder", "task_id": "t", "approve": "Bash(*)"}, "sling: approve must be a list of strings"),
]


@pytest.mark.parametrize(("document", "problem"), BAD_WIRE)
def test_from_wire_refuses_what_is_not_a_sling_request(document: dict[str, t.Any], problem: str) -> None:
    with pytest.raises(UsageError) as refused:
        SlingRequest.from_wire(document)
    assert str(refused.value).startswith(problem) and "\n" not in str(refused.value)
    assert refused.value.exit_code == 2 and refused.value.endpoint_status == 400


def _post(channel: Channel, route: str, document: t.Any) -> tuple[int, dict[str, t.Any]]:
    """One raw request to the endpoint (the client hides the status); the status and the answer's JSON."""
    import socket

    body = json.dumps(document).encode()
    head = (f"POST /v1/{route} HTTP/1.1\r\nHost: ov\r\nAuthorization: Bearer {channel.token}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    address, fd = unix_address(channel.socket_path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(address)
            conn.sendall(head + body)
            raw = b""
            while chunk := conn.recv(65536):
                raw += chunk
    finally:
        if fd is not None:
            os.close(fd)
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_bad_sling_request_through_the_real_endpoint_is_a_400_and_nothing_is_slung(
        project: ProjectPaths, state_db: t.Any) -> None:
    agent_row(state_db, project, "lead-1", "lead")
    conn = open_state(project.state_db)
    generation = sessions.get(conn, "lead-1").generation  # type: ignore[union-attr]
    conn.close()
    endpoint = AgentEndpoint(project, "lead-1", generation, ROUTES).start()
    try:
        env = endpoint.open_turn()
        channel = Channel(env[ENDPOINT_ENV], env[TOKEN_ENV])
        for document, problem in BAD_WIRE:
            status, answer = _post(channel, "sling", document)
            assert (status, answer["ok"], answer["exit_code"]) == (400, False, 2), (document, answer)
            assert answer["error"].startswith(problem), answer
        status, answer = _post(channel, "sling", {**SlingRequest(capability="builder", task_id="t").to_wire(),
                                                  "prompt_file": "x"})
        assert (status, answer["error"]) == (400, "sling: unknown field 'prompt_file'")
        with pytest.raises(EndpointError, match="^sling: unknown field 'prompt_file'$") as refused:
            channel.call("sling", {**SlingRequest(capability="builder", task_id="t").to_wire(), "prompt_file": "x"})
        assert refused.value.exit_code == 2  # what the agent's `ov sling` exits with
    finally:
        endpoint.close()
    assert [row[0] for row in state_db.execute("SELECT name FROM sessions")] == ["lead-1"]
    assert run_git(project.root, "branch", "--list", "ov/*").strip() == ""


def test_bad_merge_and_stop_requests_through_the_real_endpoint_are_a_400(project: ProjectPaths, state_db: t.Any) -> None:
    agent_row(state_db, project, "merger-m", "merger", branch=True)
    endpoint = AgentEndpoint(project, "merger-m", 1, ROUTES).start()
    try:
        env = endpoint.open_turn()
        channel = Channel(env[ENDPOINT_ENV], env[TOKEN_ENV])
        status, answer = _post(channel, "merge", {"agent": "merger-m", "dry_run": True, "allow_protected": True})
        assert (status, answer["exit_code"], answer["error"]) == (400, 2, "merge: unknown field 'allow_protected'")
        status, answer = _post(channel, "merge", {"agent": "merger-m", "tier_max": "3"})
        assert (status, answer["exit_code"]) == (400, 2) and answer["error"].startswith("merge: tier_max must be")
        status, answer = _post(channel, "stop", {"agent": "merger-m", "grace": 0})
        assert (status, answer["exit_code"], answer["error"]) == (400, 2, "stop: unknown field 'grace'")
        status, answer = _post(channel, "merge", {"all": True})
        assert (status, answer["exit_code"]) == (403, 1), answer  # a refusal still answers 403
        report = channel.call("merge", MergeRequest(agent="merger-m", dry_run=True).to_wire())
        assert report["dry_run"] and report["branch"] == "ov/merger-m"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
        env.update({ENDPOINT_ENV: channel.socket_path, TOKEN_ENV: channel.token, "OVERSTORY_AGENT_NAME": "merger-m"})
        cli = subprocess.run([*ov_command(), "merge", "merger-m", "--dry-run", "--tier-max", "2", "--json"],
                             cwd=project.root, env=env, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr  # the agent's own `ov merge`: the same request, sent by the CLI
        assert [(m["branch"], m["dry_run"]) for m in json.loads(cli.stdout)["merges"]] == [("ov/merger-m", True)]
    finally:
        endpoint.close()
