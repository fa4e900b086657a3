"""The interactive `ov watch`, driven through a real tmux pane (send-keys in, capture-pane out).

Real agents (scripted runtime: real loops, turns, git and SQLite), a real terminal
(tmux on a socket of the test's own), the real `ov` command. Nothing is mocked.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
import time
import typing as t
import uuid
from pathlib import Path

import pytest

from agent_helpers import agent_state, loop_processes, wait_for
from conftest import ov_command, run_ov
from overstory.paths import ProjectPaths
from overstory.store import events as event_store
from overstory.store import mail, sessions
from overstory.store.db import open_events, open_state
from requires import need_program

pytestmark = pytest.mark.usefixtures("_needs_tmux")


@pytest.fixture
def _needs_tmux() -> None:
    need_program("tmux")


class Pane:
    """`ov watch` running in a pane of a tmux server of this test's own."""

    def __init__(self, root: Path, *, width: int = 80, height: int = 24, env: dict[str, str] | None = None) -> None:
        self.socket = f"ov-watch-test-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        command = (f"cd {shlex.quote(str(root))} && {exports} {shlex.join(ov_command())} watch --no-watchdog "
                   f"--interval 0.5; echo WATCH-EXITED-$?; sleep 600")
        self.tmux("new-session", "-d", "-s", "w", "-x", str(width), "-y", str(height), command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "w", *keys)

    def text(self, *, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "w")

    def wait(self, predicate: t.Callable[[str], bool], what: str, timeout: float = 30) -> str:
        found = wait_for(lambda: (screen := self.text()) and predicate(screen) and screen, timeout, interval=0.2,
                         message=f"{what}; screen was:\n{self.text()}")
        return str(found)

    def close(self) -> None:
        import os

        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        base = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / self.socket
        base.unlink(missing_ok=True)  # our own server's socket: tmux may leave the file behind


@pytest.fixture
def pane_factory() -> t.Iterator[t.Callable[..., Pane]]:
    panes: list[Pane] = []

    def make(root: Path, **kwargs: t.Any) -> Pane:
        pane = Pane(root, **kwargs)
        panes.append(pane)
        return pane

    yield make
    for pane in panes:
        pane.close()


def fake_agent(conn: sqlite3.Connection, name: str, state: str) -> None:
    """A session row in ``state`` with no process behind it (what the screen shows does not need one)."""
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=f"t-{name}",
                                         runtime="scripted", actor="test")
    if state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test").ok


def agent_rows(screen: str) -> list[str]:
    """Agent names in the table rows of a screen (the first or second word: after the `>` marker)."""
    return [word for line in screen.splitlines() for word in line.split()[:2] if word.startswith("agent-")]


# ---- layout ---------------------------------------------------------------------------------


def test_at_80x24_with_ten_agents_every_active_agent_is_visible(project: ProjectPaths, state_db: sqlite3.Connection,
                                                                 pane_factory: t.Callable[..., Pane]) -> None:
    # The finished agents come first in the database: sorting must put the active ones on top.
    states = ["completed"] * 4 + ["in_turn", "between_turns", "stalled", "in_turn", "parked", "booting"]
    for index, state in enumerate(states):
        fake_agent(state_db, f"agent-{index:02d}", state)
    # Enough agents and events that something has to give at 24 lines.
    events = sqlite3.connect(project.events_db)
    for index in range(30):
        events.execute("INSERT INTO events(at, agent, kind, summary) VALUES (?, ?, 'tool_start', ?)",
                       (1_700_000_000_000 + index, "agent-04", f"step {index}"))
    events.commit()
    events.close()
    pane = pane_factory(project.root)
    screen = pane.wait(lambda s: "agent-04" in s, "the dashboard")
    lines = screen.splitlines()
    assert len(lines) <= 24
    assert "ov watch" in lines[0] and "cost $" in lines[0], "the header's first line is not cut or wrapped"
    assert "6/10 active" in lines[0]
    shown = agent_rows(screen)
    for index, state in enumerate(states):
        if state != "completed":
            assert f"agent-{index:02d}" in shown, f"active agent-{index:02d} is hidden:\n{screen}"
    active_rows = [i for i, line in enumerate(lines) if any(s in line for s in ("in_turn", "stalled", "parked",
                                                                                "booting", "between_turns"))]
    completed_rows = [i for i, line in enumerate(lines) if " completed " in f" {line} " and "agent-" in line]
    assert active_rows and completed_rows and max(active_rows) < min(completed_rows), "active agents first"
    assert "q quit" in lines[-1] and "? keys" in lines[-1]


def test_header_fits_in_80_columns_in_the_plain_render_too(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    for index, state in enumerate(["in_turn", "between_turns", "stalled", "parked", "booting", "completed"]):
        fake_agent(state_db, f"agent-with-a-long-name-{index}", state)
    out = run_ov("watch", "--once", "--width", "80", cwd=project.root).stdout
    first, second = out.splitlines()[:2]
    assert first.startswith("ov watch") and "cost $" in first and len(first) <= 80
    assert second.startswith("1 between_turns") and len(second) <= 80


# ---- keys on real agents ---------------------------------------------------------------------


def test_select_stream_mail_stop_and_quit(project: ProjectPaths, tmp_path: Path,
                                          pane_factory: t.Callable[..., Pane]) -> None:
    scenario = tmp_path / "slow.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [{"text": "thinking about the task"},
                                                           {"bash": "echo step-one"}, {"sleep": 120}],
                                               "result": "never reached"}]}))
    for name in ("busy", "other"):
        result = run_ov("sling", "builder", name, "--runtime", "scripted", "--scenario", str(scenario),
                        "--prompt", "work slowly", cwd=project.root)
        assert result.returncode == 0, result.stderr
    wait_for(lambda: (a := agent_state(project, "builder-busy")) and a.state == "in_turn", 60, message="in_turn")
    wait_for(lambda: (a := agent_state(project, "builder-other")) and a.state == "in_turn", 60, message="in_turn")
    pane = pane_factory(project.root)
    screen = pane.wait(lambda s: "builder-busy" in s and "builder-other" in s, "both agents")
    selected = next(line.split()[1] for line in screen.splitlines() if line.startswith(">"))
    target = "builder-other" if selected == "builder-busy" else "builder-busy"
    pane.keys("Down")
    pane.wait(lambda s: any(line.startswith(">") and target in line for line in s.splitlines()), "the selection moves")

    pane.keys("Enter")
    stream = pane.wait(lambda s: f"stream of {target}" in s and "echo step-one" in s, "its live stream")
    assert "thinking about the task" in stream, "assistant text shows in the stream"
    # A new event appears while the stream is open (follows like `ov logs -f`).
    events = open_events(project.events_db)
    event_store.record(events, "tool_start", agent=target, tool="Bash", summary="a-live-event")
    events.close()
    pane.wait(lambda s: "a-live-event" in s, "the stream follows new events")

    pane.keys("m")
    pane.wait(lambda s: f"mail to {target}:" in s, "the mail prompt")
    pane.keys("-l", "please also update the docs")
    pane.keys("Enter")
    pane.wait(lambda s: "sent #" in s and f"to {target}" in s, "the mail is sent")
    conn = open_state(project.state_db)
    sent = [m for m in mail.list_messages(conn, to=target) if m.subject == "please also update the docs"]
    assert len(sent) == 1 and sent[0].sender == "operator"

    pane.keys("s")
    pane.wait(lambda s: f"stop {target}? y/n" in s, "the stop question")
    pane.keys("y")
    pane.wait(lambda s: f"stopped {target}" in s, "the stop result", timeout=60)
    assert agent_state(project, target).state == "completed"
    assert loop_processes(target, project.root) == []
    assert agent_state(project, selected).state == "in_turn", "the other agent is untouched"
    conn.close()

    pane.keys("Escape")
    pane.wait(lambda s: "up/down select" in s and "NAME" in s, "back to the list")
    pane.keys("?")
    pane.wait(lambda s: "approve / reject its pending gate" in s, "the key list")
    pane.keys("Escape")
    pane.keys("q")
    pane.wait(lambda s: "WATCH-EXITED-0" in s, "q quits with status 0")


def test_a_explains_that_a_headless_agent_has_no_pane(project: ProjectPaths, state_db: sqlite3.Connection,
                                                     pane_factory: t.Callable[..., Pane]) -> None:
    fake_agent(state_db, "agent-gated", "parked")
    pane = pane_factory(project.root)
    pane.wait(lambda s: "agent-gated" in s, "the agent")
    pane.keys("a")
    pane.wait(lambda s: "runs headless" in s, "attach explains a headless agent")
    pane.keys("q")
    pane.wait(lambda s: "WATCH-EXITED-0" in s, "quit")


def test_r_resumes_a_parked_agent(project: ProjectPaths, state_db: sqlite3.Connection,
                                  pane_factory: t.Callable[..., Pane]) -> None:
    """`r` runs `ov resume` on the selected agent: an agent parked by a quota goes back to work."""
    from overstory.store import lifecycle

    fake_agent(state_db, "agent-parked", "between_turns")
    parked = sessions.get(state_db, "agent-parked")
    assert lifecycle.park(state_db, parked, "quota", "quota: claude limited", actor="test", escalate=False).ok
    pane = pane_factory(project.root)
    pane.wait(lambda s: "agent-parked" in s and "parked:quota" in s, "the parked agent and why")
    pane.keys("r")
    pane.wait(lambda s: "resumed agent-parked" in s, "the resume result", timeout=60)
    assert sessions.get(state_db, "agent-parked").state == "between_turns"
    pane.keys("q")
    pane.wait(lambda s: "WATCH-EXITED-0" in s, "quit")


def select(pane: Pane, name: str) -> None:
    """Move the selection to ``name`` (the rows re-sort as states change)."""
    for _ in range(10):
        lines = [line for line in pane.text().splitlines()
                 if any(word.startswith("agent-") for word in line.split()[:2]) and "wants" not in line]
        at = next((i for i, line in enumerate(lines) if line.startswith(">")), None)
        want = next((i for i, line in enumerate(lines) if name in line.split()[:2]), None)
        if at is not None and at == want:
            return
        pane.keys("Down" if at is None or want is None or want > at else "Up")
        time.sleep(0.4)
    raise AssertionError(f"could not select {name}:\n{pane.text()}")


def gated_agent(conn: sqlite3.Connection, name: str) -> str:
    """A fake agent parked on a real pending gate (as `ov guard` and the agent loop leave one)."""
    from overstory.store import approvals, lifecycle

    fake_agent(conn, name, "between_turns")
    _, approval_id = approvals.gate(
        conn, agent=name, generation=1, parent="operator", task_id=f"t-{name}", turn_id=None, tool="Bash",
        input='{"command":"git push origin HEAD"}', key=f"key-{name}", rule=approvals.Rule("Bash(git push*)"),
        decider="operator", timeout_s=600, on_timeout="reject")
    agent = sessions.get(conn, name)
    assert lifecycle.park(conn, agent, "approval", f"approval {approval_id}", actor="test", escalate=False).ok
    return approval_id


def test_watch_approves_a_pending_gate_in_tmux(project: ProjectPaths, state_db: sqlite3.Connection,
                                              pane_factory: t.Callable[..., Pane]) -> None:
    """Park an agent on a gate, select it, press y, and see the approval recorded and the agent resume;
    x asks for the reason and rejects."""
    yes = gated_agent(state_db, "agent-yes")
    no = gated_agent(state_db, "agent-no")
    pane = pane_factory(project.root)
    pane.wait(lambda s: "agent-yes" in s and "agent-no" in s, "the gated agents")
    select(pane, "agent-yes")
    pane.keys("y")
    pane.wait(lambda s: f"approved {yes}" in s, "the approval", timeout=60)
    assert state_db.execute("SELECT status FROM approvals WHERE id = ?", (yes,)).fetchone()[0] == "approved"
    assert sessions.get(state_db, "agent-yes").state == "between_turns"
    select(pane, "agent-no")
    pane.keys("x")
    pane.wait(lambda s: "because:" in s, "the reason prompt")
    pane.keys("not today", "Enter")
    pane.wait(lambda s: f"rejected {no}" in s, "the rejection", timeout=60)
    row = state_db.execute("SELECT status, note FROM approvals WHERE id = ?", (no,)).fetchone()
    assert tuple(row) == ("rejected", "not today")
    pane.keys("q")
    pane.wait(lambda s: "WATCH-EXITED-0" in s, "quit")


def test_no_color_removes_every_style(project: ProjectPaths, state_db: sqlite3.Connection,
                                      pane_factory: t.Callable[..., Pane]) -> None:
    fake_agent(state_db, "agent-styled", "in_turn")
    fake_agent(state_db, "agent-done", "completed")
    styled = pane_factory(project.root, env={"TERM": "xterm-256color"})
    plain = pane_factory(project.root, env={"TERM": "xterm-256color", "NO_COLOR": "1"})
    coloured = styled.wait(lambda s: "agent-styled" in s, "styled screen") and styled.text(escapes=True)
    assert "\x1b[1m" in coloured, "the control: without NO_COLOR there is bold"
    plain.wait(lambda s: "agent-styled" in s, "plain screen")
    assert "\x1b[" not in plain.text(escapes=True), "NO_COLOR: no bold, dim, reverse or colour at all"
    assert any(line.startswith(">") for line in plain.text().splitlines()), "the selection still shows, as >"


# ---- the pieces ------------------------------------------------------------------------------


def test_split_keys_reads_arrows_in_both_cursor_modes_and_typed_text() -> None:
    from overstory.cli.watch_tui import split_keys

    assert split_keys("\x1b[A\x1bOB\r") == ["up", "down", "enter"]
    assert split_keys("hi\x7f\x1b") == ["h", "i", "backspace", "esc"]
    assert split_keys("\x1b[5~\x1b[6~q") == ["pgup", "pgdn", "q"]


def test_pending_approval_without_and_with_the_table(tmp_path: Path) -> None:
    from overstory.cli.watch_actions import pending_approval

    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE sessions(name TEXT)")
    conn.commit()
    assert pending_approval(path, "builder-a") is None, "no approvals table yet: nothing pending"
    conn.execute("CREATE TABLE approvals(id TEXT PRIMARY KEY, agent TEXT, status TEXT)")
    conn.executemany("INSERT INTO approvals VALUES (?, ?, ?)",
                     [("apr-1", "builder-a", "approved"), ("apr-2", "builder-a", "pending"),
                      ("apr-3", "builder-b", "pending")])
    conn.commit()
    conn.close()
    assert pending_approval(path, "builder-a") == "apr-2"
    assert pending_approval(path, "builder-c") is None


def test_actions_run_commands_by_name(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    from overstory.cli.watch_actions import run_command

    fake_agent(state_db, "agent-a", "between_turns")
    missing = run_command(project.root, ["no-such-command", "agent-a"])
    assert not missing.ok and "no-such-command" in missing.message, missing
    sent = run_command(project.root, ["nudge", "agent-a", "carry on"])
    assert sent.ok and sent.message.startswith("sent #") and sent.message.endswith("to agent-a")
    failed = run_command(project.root, ["stop", "nobody"])
    assert not failed.ok and "no agent named 'nobody'" in failed.message
