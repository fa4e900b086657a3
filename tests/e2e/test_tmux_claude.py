"""The real Claude Code TUI in tmux mode, offline against the mock Messages API.

`ov sling --tmux` starts the interactive `claude` in the project's tmux server; the
worktree is new, so the TUI asks whether to trust it and ov answers. The dispatch
is typed in and its mail reaches the model through the worktree's hooks; later mail
is announced in the pane once it is idle; the model reports `worker_done` with a
real Bash tool call and the agent completes, its session closed and its processes
gone. Skipped without the CLI (failed on CI, see tests/claude_cli.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state
from claude_cli import CLAUDE_BIN, claude_env, requires_claude, seed_interactive_config
from conftest import run_ov
from mockapi import MockMessagesAPI, conversation_text, text_reply, tool_reply
from overstory import procs
from overstory.agents.tmux import panes as tmux_panes
from overstory.agents.tmux import server as tmux_server
from overstory.paths import ProjectPaths
from overstory.runtimes.claude import tui as claude_tui
from overstory.store import sessions

TIMEOUT = 90.0


def wait_for(predicate: t.Callable[[], t.Any], what: str, timeout: float = TIMEOUT) -> t.Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def reaped(project: ProjectPaths) -> t.Iterator[ProjectPaths]:
    """The project; afterwards every recorded process, the tmux server and its socket are gone."""
    yield project
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        rows = sessions.list_sessions(conn)
    finally:
        conn.close()
    for row in rows:
        for pid, ticks in ((row.loop_pid, row.loop_start_ticks), (row.turn_pgid, row.turn_start_ticks)):
            if pid and procs.is_alive(pid, ticks):
                procs.kill_group(pid, ticks, force=True)
        tmux_panes._kill_tagged(project, row.name, row.generation)
    name = tmux_server.socket_name(project)
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, timeout=10)
    (Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.geteuid()}" / name).unlink(missing_ok=True)


@requires_claude
def test_real_claude_tui_takes_its_dispatch_and_mail_and_completes(reaped: ProjectPaths, tmp_path: Path) -> None:
    project = reaped
    report = "ov mail send --type worker_done --subject finished --body 'reported from the TUI'"
    script = [
        text_reply("Dispatch read: BLUE"),
        tool_reply("Bash", {"command": report, "description": "report to my parent"}),
        text_reply("Reported: GREEN"),
    ]
    with MockMessagesAPI(script) as api:
        env = claude_env(api.base_url, tmp_path)
        # Onboarding done and the key approved, as on a set-up machine (ov copies that into the agent's own
        # config dir); the new worktree is trusted only in the agent's own config dir.
        seed_interactive_config(env, tmp_path / "some-other-project")
        env["OV_RUNTIME_CLAUDE_BIN"] = str(CLAUDE_BIN)
        env.pop("TMUX", None)
        done = run_ov("sling", "builder", "t1", "--tmux", "--prompt", "say BLUE", cwd=project.root, env=env,
                      timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert "ov attach builder-t1" in done.stdout
        row = agent_state(project, "builder-t1")
        assert row is not None and row.state == "working" and row.mode == "tmux"
        tui_group = row.turn_pgid

        # The typed dispatch, with the dispatch mail handed over by the hooks.
        assert api.wait_for_requests(1, timeout=TIMEOUT)
        first = conversation_text(api.main_requests[0])
        assert "[ov] You are builder-t1, a builder on task t1." in first
        assert "[ov mail]" in first and "say BLUE" in first

        def screen() -> str:
            return tmux_server.capture(project, "builder-t1") or ""

        wait_for(lambda: "Dispatch read: BLUE" in screen() and claude_tui.read_screen(screen()).idle,
                 "the answer and an idle pane")

        # Mail to the idle agent is announced in its pane; the model reports with a real Bash call.
        sent = run_ov("mail", "send", "--to", "builder-t1", "--subject", "now report PURPLE", "--body",
                      "send worker_done", cwd=project.root, env=env)
        assert sent.returncode == 0, sent.stderr
        wait_for(lambda: (agent_state(project, "builder-t1") or row).state == "completed", "completed")

    second = conversation_text(api.main_requests[1])
    assert "[ov] You have 1 new message" in second and "now report PURPLE" in second
    assert "reported from the TUI" not in second
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        done_mail = conn.execute("SELECT sender, recipient, body FROM mail WHERE type = 'worker_done'").fetchall()
    finally:
        conn.close()
    assert [tuple(r) for r in done_mail] == [("builder-t1", "operator", "reported from the TUI")]
    wait_for(lambda: "builder-t1" not in tmux_server.list_sessions(project), "the session to close")
    wait_for(lambda: not procs.group_alive(tui_group), "the TUI's processes to end")
    assert list(tmux_panes.logs_dir(project, "builder-t1").glob("*-final.txt"))
    from overstory.store import events
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        kinds = [e.kind for e in events.query(conn, agent="builder-t1", limit=1000)]
    finally:
        conn.close()
    # ov owns the agent's config dir and trusts the worktree it created there: no trust question.
    assert "tmux_dialog" not in kinds
    own = json.loads((project.run_dir / "builder-t1" / "claude" / ".claude.json").read_text())
    assert own["projects"][str(project.worktree("builder-t1"))]["hasTrustDialogAccepted"] is True
    assert {"tmux_start", "tmux_dispatch", "tmux_wake", "tmux_completed"} <= set(kinds)
