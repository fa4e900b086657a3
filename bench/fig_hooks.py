"""Figure 10: what ov's tool-call hooks add to every tool call, with the real Claude Code CLI.

One headless turn of N cheap tool calls (Read of a small file; 200 in the full run) is
played by the mock Messages API (tests/mockapi.py: only the model is scripted; the CLI,
its tools and its hooks are real). The same turn runs with no hooks, with ov's command
hooks (`ov guard` as a new process per call, as ov writes them for runtimes without HTTP
hooks) and with ov's HTTP hooks (served by the agent's endpoint), in alternating order.

The mock stamps the arrival of each model request; the gap between two requests is one
tool call's round: the mock's answer, the CLI's work, the hooks and the tool. Every round
runs each variant's turn once, back to back in a rotating order; a variant's added time
per call is the median, over rounds, of its turn's median gap minus the no-hooks turn's
median gap in the same round (the machine's load drifts by more than the effect between
rounds, so only turns run side by side are compared; a few long rounds measured less
well than many short ones). The median over call positions is given beside it.

Two "floor" variants send the same HTTP hooks to a server that answers ``{}`` at once and
does nothing else: what Claude Code itself spends per hook, which no server can go below.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

from context import Context
from harness import Stats, add_note, git, init_project, make_repo, not_available, row

REPO = Path(__file__).resolve().parent.parent
TARGET_MS = 5.0  # added per tool call by the HTTP hooks
AGENT = "builder-hooks"


def claude_binary() -> str | None:
    explicit = os.environ.get("OV_CLAUDE_BIN")
    candidates = [explicit] if explicit else [str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "claude"),
                                              "/work/main/.ci/node/node_modules/.bin/claude"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class _Stamped:
    """A responder that plays the script and notes when each main request arrived, by position."""

    def __init__(self, replies: list[t.Any]) -> None:
        from mockapi import ScriptedConversation, assistant_turns

        self.script = ScriptedConversation(replies)
        self.position = assistant_turns
        self.arrivals: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, t.Any]) -> t.Any:
        with self.lock:
            self.arrivals.setdefault(self.position(body), time.monotonic())
        return self.script(body)

    def gaps(self) -> list[float]:
        times = [self.arrivals[i] for i in sorted(self.arrivals)]
        return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


def _turn(claude: str, calls: int, worktree: Path, settings: Path, env: dict[str, str], scratch: Path,
          timeout: float) -> list[float]:
    from claude_cli import claude_env, user_message_line
    from mockapi import MockMessagesAPI, text_reply, tool_reply

    target = str(worktree / "small.txt")
    stamped = _Stamped([tool_reply("Read", {"file_path": target}) for _ in range(calls)] + [text_reply("done")])
    with MockMessagesAPI(stamped) as api:
        full_env = claude_env(api.base_url, scratch, extra=env)
        done = subprocess.run([claude, "-p", "--output-format", "stream-json", "--input-format", "stream-json",
                               "--verbose", "--permission-mode", "bypassPermissions", "--settings", str(settings),
                               "--setting-sources", ""],
                              input=user_message_line("read the file again and again"), cwd=worktree, env=full_env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"claude exited {done.returncode}: {done.stderr.strip()[-300:] or done.stdout[-300:]}")
    denied = [line for line in done.stdout.splitlines() if '"permission_denials":[{' in line]
    if denied:
        raise RuntimeError(f"a hook denied a call: {denied[0][:300]}")
    gaps = stamped.gaps()
    if len(gaps) != calls:
        raise RuntimeError(f"expected {calls} tool calls, the mock saw {len(gaps) + 1} requests")
    return gaps


class _NothingHandler(socketserver.StreamRequestHandler):
    """Reads each kept-alive request and answers ``{}`` in one write: a hook server with no work at all."""

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        while self.rfile.readline():
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.rfile.read(length)
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")


class _NothingServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True


def _floor_settings(port: int, *, post: bool) -> dict[str, t.Any]:
    """ov's HTTP hook settings (same timeout, onFailure, header) pointed at the do-nothing server."""
    from overstory.endpoint.hooks import claude_settings

    hooks = claude_settings(port)["hooks"]
    return {"hooks": {name: entries for name, entries in hooks.items() if post or name == "PreToolUse"}}


def _variants(ctx: Context, project: t.Any, worktree: Path) -> dict[str, tuple[dict[str, t.Any], dict[str, str]]]:
    """name -> (settings, extra environment), as ov writes them for an agent."""
    from overstory.runtimes.claude import hook_settings

    agent_env = {"OVERSTORY_AGENT_NAME": AGENT, "OVERSTORY_CAPABILITY": "builder",
                 "OVERSTORY_PROJECT_ROOT": str(project.root), "OVERSTORY_WORKTREE": str(worktree),
                 "OVERSTORY_BRANCH": f"ov/{AGENT}", "OVERSTORY_TASK_ID": "hooks",
                 "PATH": f"{Path(ctx.ov).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                 # ov's modules compiled once, as in an installed package (an editable install here):
                 # the command hooks are shown at their best.
                 "PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(ctx.scratch / "fig10-pycache")}
    commands = hook_settings([ctx.ov], tmux_mode=False)
    variants: dict[str, tuple[dict[str, t.Any], dict[str, str]]] = {
        "no hooks": ({}, agent_env),
        "command hooks, ov guard alone (no endpoint)": (commands, agent_env),
    }
    http = _http_hooks(project, worktree, agent_env)
    if http is not None:
        # As for every runtime without HTTP hooks: `ov guard` processes, each asking the agent's loop to judge.
        variants["command hooks, ov guard asking the loop"] = (commands, http[1])
        variants["HTTP hooks (the agent's endpoint)"] = http
        variants["HTTP PreToolUse only (the agent's endpoint)"] = (
            {"hooks": {"PreToolUse": http[0]["hooks"]["PreToolUse"]}}, http[1])
        nothing = _NothingServer(("127.0.0.1", 0), _NothingHandler)
        threading.Thread(target=nothing.serve_forever, daemon=True).start()
        _ENDPOINTS.append(nothing)
        port = nothing.server_address[1]
        variants["floor: HTTP Pre+Post hooks to a server that does nothing"] = (_floor_settings(port, post=True),
                                                                                 http[1])
        variants["floor: HTTP PreToolUse only, to a server that does nothing"] = (_floor_settings(port, post=False),
                                                                                   http[1])
    return variants


_ENDPOINTS: list[t.Any] = []


def _http_hooks(project: t.Any, worktree: Path, agent_env: dict[str, str]) -> tuple[dict[str, t.Any], dict[str, str]]:
    """An agent endpoint in this process serving the HTTP hooks, as an agent's loop does, with one open turn
    for the whole figure (its secret in the CLI's environment)."""
    from overstory.endpoint.hooks import claude_settings
    from overstory.endpoint.routes import ROUTES
    from overstory.endpoint.server import AgentEndpoint
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        if sessions.get(conn, AGENT) is None:
            sessions.create_session(conn, name=AGENT, capability="builder", task_id="hooks", runtime="claude",
                                    actor="bench", parent="operator", depth=0, branch=f"ov/{AGENT}",
                                    base_branch="main", worktree=str(worktree))
    finally:
        conn.close()
    endpoint = AgentEndpoint(project, AGENT, 1, ROUTES).start()
    _ENDPOINTS.append(endpoint)
    port = endpoint.serve_hooks()
    env = {**agent_env, **endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": "bench-turn"}),
           "OVERSTORY_GENERATION": "1", "OVERSTORY_TURN_ID": "bench-turn"}
    endpoint.set_turn_env(env)
    return claude_settings(port), env


def run(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    sys.path.insert(0, str(REPO / "tests"))
    claude = claude_binary()
    if claude is None:
        return [not_available(10, "tool-call hooks with the real claude CLI", "no claude binary (set OV_CLAUDE_BIN)")], {}
    version = subprocess.run([claude, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    from overstory.paths import ProjectPaths

    root = make_repo(ctx.scratch / "fig10-project")
    init_project(root)
    project = ProjectPaths(root)
    worktree = project.worktree(AGENT)
    git(root, "worktree", "add", "-q", "-b", f"ov/{AGENT}", str(worktree), "main")
    (worktree / "small.txt").write_text("one line\n")
    calls, rounds = ctx.p("fig10_calls"), ctx.p("fig10_rounds")
    variants = _variants(ctx, project, worktree)
    gaps: dict[str, list[list[float]]] = {name: [] for name in variants}
    errors: list[str] = []
    for number in range(rounds):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for name in order:
            settings, env = variants[name]
            settings_file = ctx.scratch / f"fig10-settings-{len(gaps[name])}-{abs(hash(name))}.json"
            settings_file.write_text(json.dumps(settings))
            try:
                gaps[name].append(_turn(claude, calls, worktree, settings_file, env, ctx.scratch / f"fig10-{number}",
                                        timeout=60 + calls * 3))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{name}, round {number + 1}: {exc}")
    rows: list[dict[str, t.Any]] = []
    base = gaps["no hooks"]
    for name, turns in gaps.items():
        if not turns:
            rows.append(not_available(10, f"{name}: per tool call", "every turn failed (see notes)"))
            continue
        flat = [gap for turn in turns for gap in turn]
        rows.append(row(10, f"{name}: one tool call's round", "ms", Stats(flat), digits=1,
                        note=f"{len(turns)} turn(s) of {calls} Read calls, claude {version}"))
        if name == "no hooks" or not base:
            continue
        # Per round: this variant's turn median minus the no-hooks turn median of the same round.
        added = [statistics.median(mine) - statistics.median(theirs) for mine, theirs in zip(turns, base)]
        positions = [statistics.median(b[i] for b in turns) - statistics.median(o[i] for o in base)
                     for i in range(calls)]
        http = name == "HTTP hooks (the agent's endpoint)"
        rows.append(row(10, f"{name}: added per tool call", "ms", Stats(added), digits=2,
                        target=f"< {TARGET_MS:g} ms" if http else None,
                        met=statistics.median(added) < TARGET_MS if http else None,
                        note=f"median over {len(added)} round(s); by call position instead: "
                             f"{statistics.median(positions):.2f} ms"))
    while _ENDPOINTS:
        server = _ENDPOINTS.pop()
        if isinstance(server, _NothingServer):
            server.shutdown()
            server.server_close()
        else:
            server.close()
    for error in errors:
        add_note(rows, error, 10)
    return rows, {"claude": claude, "version": version, "calls": calls, "rounds": rounds,
                  "gaps_ms": {name: turns for name, turns in gaps.items()}, "errors": errors}
