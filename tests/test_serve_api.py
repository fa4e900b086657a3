"""`ov serve`'s HTTP API, in-process (Starlette's test client over the real app, real SQLite, real git).

The security checks enumerate the routes from the application itself, so a route
added later is covered without touching these tests.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import typing as t
from pathlib import Path

import pytest
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from conftest import make_repo, run_git
from overstory.paths import ProjectPaths
from overstory.serve_token import ensure_token, read_token
from overstory.store import events as event_store
from overstory.store import mail, sessions
from overstory.ui.serve.app import create_app
from overstory.ui.serve.spec import ENDPOINTS

BASE = "http://127.0.0.1:7321"
ORIGIN = BASE
COOKIE = "ov_serve_7321"
SAMPLE = {"name": "nobody", "id": "1", "run": "run-x"}


@pytest.fixture
def token(project: ProjectPaths) -> str:
    return ensure_token(project).value


@pytest.fixture
def client(project: ProjectPaths, token: str) -> t.Iterator[TestClient]:
    app = create_app(project, token=token, cookie_name=COOKIE)
    with TestClient(app, base_url=BASE, follow_redirects=False) as test_client:
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: SAMPLE.get(m.group(1), "x"), path)


def every_route(app: t.Any) -> list[tuple[str, str]]:
    """(method, concrete path) for every route the application has, its static files included."""
    found = []
    for route in app.routes:
        if isinstance(route, Route):
            for method in sorted(route.methods or ()):
                found.append((method, concrete(route.path)))
        elif isinstance(route, Mount):
            found.append(("GET", route.path + "/app.js"))
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")
    return found


def database_snapshot(project: ProjectPaths) -> dict[str, t.Any]:
    conn = sqlite3.connect(project.state_db)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("sessions", "mail", "transitions", "turns", "runs", "merge_queue")}
    finally:
        conn.close()


def add_agent(conn: sqlite3.Connection, name: str, *, state: str = "between_turns", parent: str = "operator",
              **columns: t.Any) -> int:
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=name, runtime="scripted",
                                         actor="test", parent=parent, **columns)
    if state != "booting":
        outcome = sessions.transition(conn, name, generation, state, actor="test", reason="set up by the test")
        assert outcome.ok, outcome
    return generation


# ---- the token --------------------------------------------------------------------------------


def test_init_creates_a_private_git_ignored_token(project: ProjectPaths) -> None:
    path = project.serve_token_file
    assert path.is_file() and (path.stat().st_mode & 0o777) == 0o600
    token = read_token(project)
    assert token and len(token) >= 40
    assert run_git(project.root, "check-ignore", str(path)).strip() == str(path)
    assert ensure_token(project).value == token and not ensure_token(project).created


def test_first_serve_of_an_older_project_makes_the_token_and_ignores_it(tmp_path: Path) -> None:
    from overstory.project.init import init_project

    repo = make_repo(tmp_path / "old")
    init_project(repo)
    project = ProjectPaths(repo)
    project.serve_token_file.unlink()
    ignore = project.ov_dir / ".gitignore"
    # The .gitignore `ov init` wrote before it became "ignore all but config, roles and templates".
    ignore.write_text("*.db\n*.db-wal\n*.db-shm\nconfig.local.yaml\nlogs/\nworktrees/\nrun/\nlocks/\n")
    made = ensure_token(project)
    assert made.created and "serve-token" in ignore.read_text().splitlines()
    assert run_git(repo, "status", "--porcelain", "--untracked-files=all").count("serve-token") == 0
    project.serve_token_file.chmod(0o644)
    assert read_token(project) == made.value and (project.serve_token_file.stat().st_mode & 0o777) == 0o600


def test_processes_creating_the_token_at_once_agree_on_one(tmp_path: Path) -> None:
    from overstory.project.init import init_project

    repo = make_repo(tmp_path / "race")
    init_project(repo)
    project = ProjectPaths(repo)
    project.serve_token_file.unlink()
    probe = "import sys; from overstory.paths import ProjectPaths; from overstory.serve_token import ensure_token; " \
            "print(ensure_token(ProjectPaths(__import__('pathlib').Path(sys.argv[1]))).value)"
    procs = [subprocess.Popen([sys.executable, "-c", probe, str(repo)], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    values = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert values == {read_token(project)}
    assert not list(project.ov_dir.glob(".serve-token.*")), "no temporary file is left behind"


KILLED_BEFORE_LINK = textwrap.dedent("""
    import os, pathlib, sys, time
    from overstory.paths import ProjectPaths
    from overstory import serve_token
    def stuck(*args):
        print("written", flush=True)
        time.sleep(600)
    os.link = stuck
    serve_token.ensure_token(ProjectPaths(pathlib.Path(sys.argv[1])))
""")


def test_a_creator_killed_before_linking_leaves_nothing_the_next_one_trips_on(tmp_path: Path) -> None:
    from overstory.project.init import init_project

    repo = make_repo(tmp_path / "killed")
    init_project(repo)
    project = ProjectPaths(repo)
    project.serve_token_file.unlink()
    victim = subprocess.Popen([sys.executable, "-c", KILLED_BEFORE_LINK, str(repo)], stdout=subprocess.PIPE, text=True)
    assert victim.stdout is not None and victim.stdout.readline().strip() == "written"
    leftovers = list(project.ov_dir.glob(".serve-token.*.tmp"))
    assert [p.name for p in leftovers] == [f".serve-token.{victim.pid}.tmp"]
    victim.kill()
    victim.wait(timeout=10)
    assert read_token(project) is None, "no half-made token is visible"
    made = ensure_token(project)
    assert made.created and read_token(project) == made.value
    assert list(project.ov_dir.glob(".serve-token.*.tmp")) == [], "the dead creator's file is removed"


# ---- 401 everywhere ---------------------------------------------------------------------------


def test_the_app_serves_exactly_the_documented_routes(client: TestClient) -> None:
    routes = {(m, r.path) for r in client.app.routes if isinstance(r, Route) for m in r.methods or () if m != "HEAD"}
    assert routes == {(e.method, e.path) for e in ENDPOINTS}


PUBLIC = {("GET", "/"), ("GET", "/static/app.js"), ("GET", "/api/docs"), ("GET", "/api/openapi.json")}


def test_every_route_refuses_a_missing_or_wrong_token(client: TestClient, token: str) -> None:
    routes = every_route(client.app) + [("GET", "/no/such/route"), ("POST", "/api/nothing")]
    assert len(routes) > len(ENDPOINTS)
    wrong = token[:-4] + ("aaaa" if not token.endswith("aaaa") else "bbbb")
    attempts = {"no token": {}, "wrong bearer": bearer(wrong), "token in the query": {},
                "empty bearer": {"Authorization": "Bearer "}, "basic auth": {"Authorization": f"Basic {token}"},
                # the cookie an older ov set, with the right token: no cookie authenticates any more
                "old cookie": {"Cookie": f"{COOKIE}={token}"}, "ticket that was never issued": {}}
    for method, path in routes:
        if (method.replace("HEAD", "GET"), path) in PUBLIC:
            continue
        for label, headers in attempts.items():
            query = {"token in the query": f"?token={token}", "ticket that was never issued": f"?ticket={token}"}
            url = path + query.get(label, "")
            response = client.request(method, url, headers={"Origin": ORIGIN, **headers}, content=b"{}")
            assert response.status_code == 401, (method, path, label, response.status_code, response.text[:200])
            if path.startswith(("/api", "/events")) and method != "HEAD":
                assert response.json() == {"error": "missing or wrong token"}
            assert response.headers["www-authenticate"].startswith("Bearer")
    # The right token works on every GET route (control).
    for method, path in routes:
        if method == "GET" and path != "/events/stream" and "no/such" not in path:
            assert client.get(path, headers=bearer(token)).status_code != 401, path


def test_the_page_and_the_docs_need_no_token_and_hold_no_data(client: TestClient, token: str,
                                                              state_db: sqlite3.Connection) -> None:
    add_agent(state_db, "secret-agent-name")
    for method, path in PUBLIC:
        response = client.request(method, path)
        assert response.status_code == 200, path
        assert "secret-agent-name" not in response.text and token not in response.text
        assert "set-cookie" not in response.headers
        assert "default-src 'none'" in response.headers["content-security-policy"]
        assert response.headers["referrer-policy"] == "same-origin"


def test_an_old_sign_in_link_fails_clearly_and_sets_no_cookie(client: TestClient, token: str) -> None:
    wrong = "x" * len(token)
    for link in (f"/?token={token}", f"/?token={wrong}", "/?token="):
        response = client.get(link)
        assert response.status_code == 410, link
        assert "older ov" in response.text and "/#token=" in response.text
        assert token not in response.text
        assert "set-cookie" not in response.headers


def test_a_cookie_an_older_ov_set_is_expired_and_never_accepted(client: TestClient, token: str) -> None:
    jar = {"Cookie": f"other=1; {COOKIE}={token}"}
    for path in ("/", "/api/agents"):
        response = client.get(path, headers=jar)
        expired = [v for k, v in response.headers.multi_items() if k == "set-cookie"]
        assert expired and expired[0].startswith(f"{COOKIE}=;") and "Max-Age=0" in expired[0], path
        assert token not in expired[0]
    assert client.get("/api/agents", headers=jar).status_code == 401
    assert "set-cookie" not in client.get("/api/agents", headers=bearer(token)).headers


def test_a_stream_ticket_works_once_only_for_the_stream_and_only_for_a_while() -> None:
    from overstory.ui.serve.security import Gate, Tickets

    async def downstream(scope: t.Any, receive: t.Any, send: t.Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"through"})

    now = [1000.0]
    tickets = Tickets(seconds=30, kept=3, clock=lambda: now[0])
    gate = TestClient(Gate(downstream, token="t" * 40, cookie_name=COOKIE, tickets=tickets), base_url=BASE)
    first = tickets.issue()
    assert gate.get(f"/events/stream?ticket={first}").status_code == 200
    assert gate.get(f"/events/stream?ticket={first}").status_code == 401, "a ticket is single use"
    other = tickets.issue()
    assert gate.get(f"/api/agents?ticket={other}").status_code == 401, "a ticket opens only the stream"
    late = tickets.issue()
    now[0] += 31
    assert gate.get(f"/events/stream?ticket={late}").status_code == 401, "a ticket expires"
    many = [tickets.issue() for _ in range(4)]
    assert gate.get(f"/events/stream?ticket={many[0]}").status_code == 401, "only the newest are kept"
    assert gate.get(f"/events/stream?ticket={many[-1]}").status_code == 200


def test_the_ticket_route_needs_the_token_and_hands_out_distinct_tickets(client: TestClient, token: str) -> None:
    assert client.post("/api/events/ticket", json={}).status_code == 401
    answers = [client.post("/api/events/ticket", json={}, headers=bearer(token)) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 201]
    first, second = (a.json()["ticket"] for a in answers)
    assert first != second and len(first) >= 24 and token not in (first, second)
    assert answers[0].json()["expires_in"] == 30


# ---- same origin, same host -------------------------------------------------------------------


def test_cross_origin_writes_are_refused_and_change_nothing(client: TestClient, token: str,
                                                              project: ProjectPaths) -> None:
    send = {"to": "operator", "subject": "hello", "body": "from the page"}
    before = database_snapshot(project)
    refused = [
        {**bearer(token), "Origin": "http://evil.example"},  # credentials do not excuse a foreign origin
        {**bearer(token), "Origin": "http://127.0.0.1:9999"},  # another port is another origin
        {**bearer(token), "Origin": "null"},
        {**bearer(token), "Referer": "http://evil.example/page"},
    ]
    for headers in refused:
        response = client.post("/api/mail", json=send, headers=headers)
        assert response.status_code == 403, headers
        assert "cross-origin" in response.json()["error"]
    assert database_snapshot(project) == before
    for headers in ({**bearer(token), "Origin": ORIGIN}, {**bearer(token), "Referer": ORIGIN + "/#agent=x"},
                    bearer(token)):
        assert client.post("/api/mail", json=send, headers=headers).status_code == 201, headers
    conn = sqlite3.connect(project.state_db)
    assert conn.execute("SELECT count(*) FROM mail WHERE recipient = 'operator'").fetchone()[0] == 3
    conn.close()


def test_requests_for_another_host_name_are_refused(client: TestClient, token: str) -> None:
    """A page that rebinds its own DNS name to 127.0.0.1 still sends its name in Host."""
    for host in ("evil.example", "evil.example:7321", "127.0.0.1.evil.example"):
        response = client.get("/api/agents", headers={**bearer(token), "Host": host})
        assert response.status_code == 421, host
    for host in ("127.0.0.1:7321", "localhost:7321", "[::1]:7321"):
        assert client.get("/api/agents", headers={**bearer(token), "Host": host}).status_code == 200, host


def test_a_server_on_all_interfaces_accepts_any_host(project: ProjectPaths, token: str) -> None:
    app = create_app(project, token=token, cookie_name=COOKIE, allowed_hosts=None)
    with TestClient(app, base_url="http://192.168.1.20:7321") as lan:
        assert lan.get("/api/agents", headers=bearer(token)).status_code == 200
        assert lan.get("/api/agents").status_code == 401


# ---- reading files --------------------------------------------------------------------------------


def test_the_diff_route_reads_only_agents_worktrees(client: TestClient, token: str, project: ProjectPaths,
                                                     state_db: sqlite3.Connection, tmp_path: Path) -> None:
    outside = make_repo(tmp_path / "elsewhere", {"secret.txt": "TOP-SECRET\n"})
    (outside / "secret.txt").write_text("TOP-SECRET changed\n")
    run_git(project.root, "branch", "ov/sneaky")
    add_agent(state_db, "sneaky", worktree=str(outside), branch="ov/sneaky", base_branch="main")
    for name in ("..", "../..", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "%2e%2e%2f%2e%2e%2fetc", "/etc/passwd",
                 "..\\..\\etc", "a/../../b", "sneaky%00", "Sneaky"):
        response = client.get(f"/api/agents/{name}/diff", headers=bearer(token))
        assert response.status_code in (400, 404), (name, response.status_code)
        assert "root:" not in response.text and "TOP-SECRET" not in response.text
    tampered = client.get("/api/agents/sneaky/diff", headers=bearer(token))
    assert tampered.status_code == 200 and "TOP-SECRET" not in tampered.text, "a row pointing outside is not read"
    for path in ("/static/../../pyproject.toml", "/static/%2e%2e/%2e%2e/serve_token.py", "/static/..%2f..%2fapp.py",
                 "/static//etc/passwd", f"/static/{project.serve_token_file}"):
        response = client.get(path, headers=bearer(token))
        assert response.status_code in (400, 404), (path, response.status_code)
        assert token not in response.text and "root:" not in response.text and "[project]" not in response.text


def test_the_diff_route_shows_committed_uncommitted_and_new_files(client: TestClient, token: str,
                                                                   project: ProjectPaths,
                                                                   state_db: sqlite3.Connection) -> None:
    worktree = project.worktree("builder-d")
    run_git(project.root, "worktree", "add", "-q", "-b", "ov/builder-d", str(worktree), "main")
    (worktree / "README.md").write_text("hello\ncommitted line\n")
    run_git(worktree, "commit", "-qam", "work")
    (worktree / "README.md").write_text("hello\ncommitted line\nuncommitted line\n")
    (worktree / "new.txt").write_text("brand new\n")
    add_agent(state_db, "builder-d", worktree=str(worktree), branch="ov/builder-d", base_branch="main")
    diff = client.get("/api/agents/builder-d/diff", headers=bearer(token))
    assert diff.status_code == 200 and diff.headers["content-type"].startswith("text/plain")
    for line in ("+committed line", "+uncommitted line", "+brand new"):
        assert line in diff.text
    stat = client.get("/api/agents/builder-d/diff?stat=1", headers=bearer(token)).text
    assert "README.md" in stat and "new.txt" in stat and "+committed" not in stat
    assert client.get("/api/agents/nobody/diff", headers=bearer(token)).status_code == 404


# ---- bad bodies --------------------------------------------------------------------------------


POSTS = [e for e in ENDPOINTS if e.method == "POST" and e.op != "webhook"]  # a webhook's body is the sender's: never read
BAD_BODIES: list[tuple[str, bytes, str | None, str]] = [
    ("not JSON", b"{bad", "application/json", "not valid JSON"),
    ("a list", b"[1, 2]", "application/json", "must be a JSON object"),
    ("a string", b'"stop"', "application/json", "must be a JSON object"),
    ("an unknown field", b'{"surprise": true}', "application/json", "surprise"),
    ("a form post", b"a=1", "application/x-www-form-urlencoded", "application/json"),
    ("text/plain", b"{}", "text/plain", "application/json"),
    ("not UTF-8", b'{"subject": "\xff\xfe"}', "application/json", "not valid JSON"),
    ("too big", b'{"body": "' + b"x" * (3 * 1024 * 1024) + b'"}', "application/json", "limit"),
]


@pytest.mark.parametrize("endpoint", POSTS, ids=[e.op for e in POSTS])
def test_malformed_bodies_get_a_clear_4xx_and_change_nothing(endpoint: t.Any, client: TestClient, token: str,
                                                             project: ProjectPaths,
                                                             state_db: sqlite3.Connection) -> None:
    add_agent(state_db, "nobody")
    mail.send(state_db, sender="nobody", to="operator", subject="question", type="question", body="?")
    before = database_snapshot(project)
    for label, raw, media, words in BAD_BODIES:
        headers = {**bearer(token), **({"Content-Type": media} if media else {})}
        response = client.post(concrete(endpoint.path), content=raw, headers=headers)
        assert 400 <= response.status_code < 500, (endpoint.op, label, response.status_code, response.text[:200])
        error = response.json()["error"]
        assert words in error and "\n" not in error and "Traceback" not in error, (endpoint.op, label, error)
    assert database_snapshot(project) == before


def test_wrong_types_are_refused_not_coerced(client: TestClient, token: str, state_db: sqlite3.Connection,
                                             project: ProjectPaths) -> None:
    add_agent(state_db, "nobody")
    before = database_snapshot(project)
    for path, body, field in (("/api/agents/nobody/stop", {"force": "yes"}, "force"),
                              ("/api/agents/nobody/stop", {"force": 1}, "force"),
                              ("/api/mail", {"to": "operator", "subject": 7}, "subject"),
                              ("/api/mail", {"to": "operator"}, "subject"),
                              ("/api/mail", {"to": "operator", "subject": "s", "payload": [1]}, "payload"),
                              ("/api/sling", {"capability": "builder", "task_id": "t", "files": "a.py"}, "files"),
                              ("/api/sling", {"capability": "builder", "task_id": "t", "scenario": "/etc/x"},
                               "scenario")):
        response = client.post(path, json=body, headers=bearer(token))
        assert response.status_code == 422, (path, body)
        assert response.json()["error"].startswith("bad request body: " + field), response.json()
    for path, query in (("/api/events", "since=-1"), ("/api/events", "limit=lots"), ("/api/agents", "all=maybe"),
                        ("/api/mail", "thread=x"), ("/api/merge/predict", ""), ("/api/events", "limit=999999")):
        response = client.get(f"{path}?{query}", headers=bearer(token))
        assert response.status_code == 400 and response.json()["error"], (path, query)
    assert client.get("/events/stream", headers={**bearer(token), "Last-Event-ID": "x1"}).status_code == 400
    assert database_snapshot(project) == before


# ---- every route answers --------------------------------------------------------------------------


REQUIRED_QUERY = {"/api/merge/predict": "?all=1"}  # a route that needs its question asked


def test_every_get_route_answers_200_with_the_token(project: ProjectPaths, client: TestClient, token: str,
                                                    state_db: sqlite3.Connection) -> None:
    """Not merely "not 401": each GET route of the app (the stream aside) has its core function behind it and
    answers 200 for things that exist (the agent, mail #1 and run of ``SAMPLE``)."""
    from overstory.store import runs

    worktree = project.worktree(SAMPLE["name"])
    run_git(project.root, "worktree", "add", "-q", "-b", f"ov/{SAMPLE['name']}", str(worktree), "main")
    run_id = runs.open_or_join(state_db, "coordinator")[0].id
    add_agent(state_db, SAMPLE["name"], worktree=str(worktree), branch=f"ov/{SAMPLE['name']}", base_branch="main",
              run_id=run_id)
    first = mail.send(state_db, sender=SAMPLE["name"], to="operator", subject="hello", body="b")
    checked = []
    for method, path in every_route(client.app):
        if method != "GET" or path == "/events/stream" or "no/such" in path:
            continue
        path = path.replace("/" + SAMPLE["run"], "/" + run_id).replace("/mail/1", f"/mail/{first[0]}")
        path += REQUIRED_QUERY.get(path, "")
        response = client.get(path, headers=bearer(token))
        assert response.status_code == 200, (path, response.status_code, response.text[:300])
        checked.append(path)
    assert {"/api/approvals", "/api/costs", f"/api/agents/{SAMPLE['name']}"} <= set(checked), checked


# ---- documentation and imports ---------------------------------------------------------------------


def test_openapi_and_the_docs_page_cover_every_route(client: TestClient, token: str) -> None:
    document = client.get("/api/openapi.json", headers=bearer(token)).json()
    assert document["openapi"].startswith("3.1")
    for endpoint in ENDPOINTS:
        operation = document["paths"][endpoint.path][endpoint.method.lower()]
        assert operation["operationId"] == endpoint.op and operation["summary"]
        if endpoint.body:
            assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(endpoint.body)
    assert "from" in document["components"]["schemas"]["SendBody"]["properties"]
    docs = client.get("/api/docs", headers=bearer(token)).text
    for endpoint in ENDPOINTS:
        assert endpoint.path.replace("{", "&#x7b;") in docs or endpoint.path in docs


def test_serve_help_lists_every_route(project: ProjectPaths) -> None:
    from conftest import run_ov

    result = run_ov("serve", "--help", cwd=project.root)
    assert result.returncode == 0
    for endpoint in ENDPOINTS:
        assert re.search(rf"{endpoint.method}\s+{re.escape(endpoint.path)}\s", result.stdout), endpoint.path


IMPORT_PROBE = textwrap.dedent("""
    import json, sys
    from overstory.cli.main import cli
    for args in json.loads(sys.argv[1]):
        try:
            cli.main(args=args, prog_name="ov", standalone_mode=False)
        except SystemExit:
            pass
    print(json.dumps(sorted({n.split(".")[0] for n in sys.modules} & {"starlette", "uvicorn", "anyio", "httpx"})))
""")


def test_no_hot_command_imports_the_web_server(project: ProjectPaths) -> None:
    guard_input = json.dumps({"tool_name": "Bash", "tool_input": {"command": "ls"}})
    calls = [["--project", str(project.root), *c] for c in (
        ["status", "--json"], ["mail", "send", "--to", "operator", "--subject", "s"], ["mail", "check", "--json"],
        ["--help"], ["serve", "--help"])]
    result = subprocess.run([sys.executable, "-c", IMPORT_PROBE, json.dumps(calls)], capture_output=True, text=True,
                            cwd=project.root, timeout=60, input=guard_input)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
    guard = subprocess.run([sys.executable, "-c", IMPORT_PROBE, json.dumps([["guard"]])], capture_output=True,
                           text=True, cwd=project.root, timeout=60, input=guard_input,
                           env={**os.environ, "OVERSTORY_AGENT_NAME": "builder-x"})
    assert json.loads(guard.stdout.strip().splitlines()[-1]) == []


def test_only_the_serve_package_imports_starlette_or_uvicorn() -> None:
    from test_layers import PACKAGE, all_modules, imports_of

    modules = all_modules()
    users = sorted(name for name, path in modules.items()
                   if {i.split(".")[0] for i in imports_of(path.read_text(), name, modules)} & {"starlette", "uvicorn"})
    assert users and all(name.startswith("overstory.ui.serve.") for name in users), users
    assert (PACKAGE / "ui" / "serve" / "static" / "app.js").is_file()


def test_concurrent_requests_each_use_their_own_connections(client: TestClient, token: str,
                                                            events_db: sqlite3.Connection) -> None:
    for i in range(50):
        event_store.record(events_db, "assistant_text", agent="a", summary=f"line {i}")
    answers: list[int] = []

    def ask() -> None:
        for _ in range(10):
            answers.append(len(client.get("/api/events?limit=20", headers=bearer(token)).json()["events"]))

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert answers == [20] * 80
