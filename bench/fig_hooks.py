"""Figure 10: what ov's tool-call hooks add to every tool call, with the real Claude Code CLI.

One headless turn of N cheap tool calls (Read of a small file; 200 in the full run) is
played by the mock Messages API (tests/mockapi.py: only the model is scripted; the CLI,
its tools and its hooks are real). The same turn runs with no hooks, with ov's command
hooks (`ov guard` as a new process per call, as ov writes them for runtimes without HTTP
hooks) and with ov's HTTP hooks (served by the agent's endpoint), in alternating order.
Where ov's PreToolUse hook writes the ledger's rows, the turn's stdout is read while it
runs and the receipts are stored from it, as the agent's loop does (a headless turn has
no PostToolUse hook); the HTTP Pre+Post variant shows what receipts by hook cost instead.

The mock (in a process of its own: bench/model_server.py) stamps the arrival of each model
request; the gap between two requests is one tool call's round: the mock's answer, the
CLI's work, the hooks and the tool. Every round
runs each variant's turn once, back to back in a rotating order; a variant's added time
per call is the median, over rounds, of its turn's median gap minus the no-hooks turn's
median gap in the same round (the machine's load drifts by more than the effect between
rounds, so only turns run side by side are compared; a few long rounds measured less
well than many short ones). The median over call positions is given beside it.

The "floor" variants send the same HTTP hooks to a server that answers ``{}`` at once and
does nothing else: in the benchmark's process (where it shares the GIL with the reading of
the turn's stream, as ov's endpoint does in an agent's loop) and in a process of its own
(bench/hook_floor_server.py): what Claude Code itself spends per hook, which no server can
go below.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

from context import Context
from harness import Stats, add_note, git, init_project, make_repo, not_available, row
from hook_floor_server import NothingHandler, NothingServer

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TARGET_MS = 5.0  # added per tool call by the HTTP hooks
AGENT = "builder-hooks"
OV_HTTP = "HTTP hooks as ov writes them (PreToolUse; receipts from the stream)"
# Variants whose PreToolUse hook writes ledger rows and whose receipts the loop reads from the stream.
FLOOR_ALONE = "floor: HTTP PreToolUse only, to a server that does nothing in its own process"
STREAM_RECEIPTS = ("command hooks, ov guard alone (no endpoint)", "command hooks, ov guard asking the loop", OV_HTTP)


def claude_binary() -> str | None:
    explicit = os.environ.get("OV_CLAUDE_BIN")
    candidates = [explicit] if explicit else [str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "claude"),
                                              "/work/main/.ci/node/node_modules/.bin/claude"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _turn(claude: str, calls: int, worktree: Path, settings: Path, env: dict[str, str], scratch: Path,
          timeout: float, receipts: t.Callable[[str], None] | None = None) -> list[float]:
    """One turn's gaps. Its stdout is read line by line while it runs, as the agent's loop reads it;
    ``receipts`` is given each line where ov's ledger takes its receipts from the stream."""
    from claude_cli import claude_env, user_message_line

    model = subprocess.Popen([sys.executable, str(BENCH / "model_server.py"), "--calls", str(calls),
                              "--file", str(worktree / "small.txt")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert model.stdin is not None and model.stdout is not None
    try:
        full_env = claude_env(model.stdout.readline().strip(), scratch, extra=env)
        proc = subprocess.Popen([claude, "-p", "--output-format", "stream-json", "--input-format", "stream-json",
                                 "--verbose", "--permission-mode", "bypassPermissions", "--settings", str(settings),
                                 "--setting-sources", ""], cwd=worktree, env=full_env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        errors: list[str] = []
        drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        drain.start()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(user_message_line("read the file again and again"))
            proc.stdin.close()
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if receipts is not None:
                    receipts(line)
            returncode = proc.wait()
            drain.join()
        finally:
            watchdog.cancel()
    finally:
        model.stdin.close()
        gaps_line = model.stdout.readline()
        model.wait(timeout=30)
    stdout = "".join(lines)
    if returncode != 0:
        raise RuntimeError(f"claude exited {returncode}: {''.join(errors).strip()[-300:] or stdout[-300:]}")
    denied = [line for line in stdout.splitlines() if '"permission_denials":[{' in line]
    if denied:
        raise RuntimeError(f"a hook denied a call: {denied[0][:300]}")
    gaps = json.loads(gaps_line)
    if len(gaps) != calls:
        raise RuntimeError(f"expected {calls} tool calls, the mock saw {len(gaps) + 1} requests")
    return gaps


def _with_post_hooks(settings: dict[str, t.Any]) -> dict[str, t.Any]:
    """ov's HTTP PreToolUse settings plus HTTP PostToolUse/PostToolUseFailure hooks to the endpoint's
    ``hook.post`` (how ov took receipts before they came from the stream), for comparison."""
    pre = settings["hooks"]["PreToolUse"][0]["hooks"][0]
    post = {key: value for key, value in pre.items() if key != "onFailure"}
    post["url"] = pre["url"].replace("/v1/hook.pre", "/v1/hook.post")
    entries = [{"matcher": ".*", "hooks": [post]}]
    return {"hooks": {**settings["hooks"], "PostToolUse": entries, "PostToolUseFailure": entries}}


def _floor_settings(port: int, *, post: bool) -> dict[str, t.Any]:
    """ov's HTTP hook settings (same timeout, onFailure, header) pointed at the do-nothing server."""
    from overstory.endpoint.hooks import claude_settings

    settings = claude_settings(port)
    return _with_post_hooks(settings) if post else settings


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
        variants[OV_HTTP] = http
        variants["HTTP Pre+Post hooks (receipts by hook, as before)"] = (_with_post_hooks(http[0]), http[1])
        nothing = NothingServer(("127.0.0.1", 0), NothingHandler)
        threading.Thread(target=nothing.serve_forever, daemon=True).start()
        _ENDPOINTS.append(nothing)
        port = nothing.server_address[1]
        variants["floor: HTTP Pre+Post hooks to a server that does nothing"] = (_floor_settings(port, post=True),
                                                                                 http[1])
        variants["floor: HTTP PreToolUse only, to a server that does nothing"] = (_floor_settings(port, post=False),
                                                                                   http[1])
        # The same server in a process of its own: no GIL shared with the stream's reader, so Claude Code's own cost.
        alone = subprocess.Popen([sys.executable, str(BENCH / "hook_floor_server.py")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert alone.stdout is not None
        _ENDPOINTS.append(alone)
        variants[FLOOR_ALONE] = (_floor_settings(int(alone.stdout.readline()), post=False), http[1])
    return variants


_ENDPOINTS: list[t.Any] = []


class _StreamReceipts:
    """What the agent's loop does with a turn's stdout for the ledger: parse each line and store the
    receipts of the calls the PreToolUse hook recorded (``ledger.StreamLedger``). After the turn, every
    call of it must have its receipt. A no-op for ``env`` None."""

    def __init__(self, project: t.Any, env: dict[str, str] | None) -> None:
        self.project, self.env = project, env
        self.conn: t.Any = None

    def __enter__(self) -> t.Callable[[str], None] | None:
        if self.env is None:
            return None
        from overstory.agents.ledger import LedgerContext, StreamLedger
        from overstory.runtimes import get_runtime
        from overstory.store.db import open_state

        self.conn = open_state(self.project.state_db)
        self.conn.execute("DELETE FROM tool_calls WHERE agent = ?", (AGENT,))  # this turn's calls only
        parser = get_runtime("claude").new_parser()
        ledger = StreamLedger(self.conn, LedgerContext.from_env(self.env) or LedgerContext(AGENT), receipts_only=True)
        return lambda line: ledger.feed(parser.feed(line, now=time.monotonic()))

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.conn is None:
            return
        try:
            open_rows = self.conn.execute("SELECT count(*) FROM tool_calls WHERE agent = ? AND status != 'succeeded'",
                                          (AGENT,)).fetchone()[0]
            done = self.conn.execute("SELECT count(*) FROM tool_calls WHERE agent = ? AND status = 'succeeded'",
                                     (AGENT,)).fetchone()[0]
        finally:
            self.conn.close()
        if kind is None and (open_rows or not done):
            raise RuntimeError(f"the ledger has {open_rows} call(s) without a receipt and {done} with one")


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
                with _StreamReceipts(project, env if name in STREAM_RECEIPTS else None) as receipts:
                    turn = _turn(claude, calls, worktree, settings_file, env, ctx.scratch / f"fig10-{number}",
                                 timeout=60 + calls * 3, receipts=receipts)
                gaps[name].append(turn)
            except RuntimeError as exc:
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
        http = name == OV_HTTP
        rows.append(row(10, f"{name}: added per tool call", "ms", Stats(added), digits=2,
                        target=f"< {TARGET_MS:g} ms" if http else None,
                        met=statistics.median(added) < TARGET_MS if http else None,
                        note=f"median over {len(added)} round(s); by call position instead: "
                             f"{statistics.median(positions):.2f} ms"))
    while _ENDPOINTS:
        server = _ENDPOINTS.pop()
        if isinstance(server, NothingServer):
            server.shutdown()
            server.server_close()
        elif isinstance(server, subprocess.Popen):
            server.stdin.close()
            server.wait(timeout=30)
        else:
            server.close()
    for error in errors:
        add_note(rows, error, 10)
    return rows, {"claude": claude, "version": version, "calls": calls, "rounds": rounds,
                  "gaps_ms": {name: turns for name, turns in gaps.items()}, "errors": errors}
