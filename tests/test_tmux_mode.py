"""tmux mode: names, screen reading, and agents driven in a real tmux server.

The integration tests run ``tests/fake_tui.py`` (a small TUI that draws the parts of
Claude Code's screen ov reads and runs the worktree's hooks) as the runtime, in a
real tmux server on the project's own socket; the ``tmux_project`` fixture kills
that server, unlinks its socket and kills every process the test's agents recorded.
The real Claude Code TUI is exercised in tests/e2e/test_tmux_claude.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import TESTS_DIR, run_git, run_ov
from overstory import procs
from overstory.agents.tmux import panes as tmux_panes
from overstory.agents.tmux import server as tmux_server
from overstory.agents.tmux import session as tmux_mode
from overstory.agents.tmux.server import session_name, socket_name
from overstory.errors import InvalidName, TmuxError
from overstory.paths import ProjectPaths
from overstory.runtimes.claude import tui as claude_tui
from overstory.runtimes.claude.tui import activity_fingerprint, read_screen
from overstory.store import sessions
from requires import need_program, requires_tmux

needs_tmux = requires_tmux
NBSP = "\u00a0"
RULE = "─" * 120
FOOTER = "  ⏵⏵ bypass permissions on (shift+tab to cycle) · ← for agents"
BUSY_FOOTER = "  ⏵⏵ bypass permissions on (shift+tab to cycle) · esc to interrupt · ← for agents"
WELCOME = ["", " ▐▛███▛█   Claude Code v2.1.330", "▝▜██████▀  Opus 5.5 · API Usage Billing", " ▝▝   ▝▝   /work/repo"]
EFFORT = " " * 100 + "◐ medium · /effort"


def claude_screen(*body: str, typed: str = "", footer: str = FOOTER) -> str:
    """A screen shaped like Claude Code 2.1.330's at 120x40 (captured with tmux capture-pane)."""
    return "\n".join([*WELCOME, "", *body, "", EFFORT, RULE, f"❯{NBSP}{typed}", RULE, footer, ""])


# --------------------------------------------------------------------------- names


def test_session_names_come_from_the_agent_name_and_never_collide() -> None:
    assert session_name("builder-task-42") == "builder-task-42"
    dotted = session_name("builder-v1.2")
    assert "." not in dotted and ":" not in dotted and dotted.startswith("builder-v1_2+")
    assert dotted != session_name("builder-v1_2")  # '_' is a legal agent name character too
    assert session_name("builder-v1.2") == dotted  # stable
    for bad in ("", "Upper", "a:b", "-x", "a b"):
        with pytest.raises(InvalidName):
            session_name(bad)


def test_socket_name_is_per_project_and_stable(tmp_path: Path) -> None:
    one, two = ProjectPaths(tmp_path / "one"), ProjectPaths(tmp_path / "two")
    assert socket_name(one) == socket_name(ProjectPaths(tmp_path / "one"))
    assert socket_name(one) != socket_name(two)
    assert socket_name(one).startswith("ov-") and len(socket_name(one)) == 13


def test_attach_command_targets_the_exact_session(tmp_path: Path) -> None:
    command = tmux_server.attach_command(ProjectPaths(tmp_path), "builder-1", read_only=True)
    assert command[1:] == ["-L", socket_name(ProjectPaths(tmp_path)), "attach-session", "-r", "-t", "=builder-1"]


def test_tui_command_skips_the_bypass_warning_and_passes_the_model(tmp_path: Path) -> None:
    fake = tmp_path / "claude"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    argv = claude_tui.tui_command(str(fake), "sonnet", settings={"hooks": {"X": []}}, extra_flags=["--foo"])
    assert argv[:3] == [str(fake), "--permission-mode", "bypassPermissions"]
    settings = json.loads(argv[argv.index("--settings") + 1])
    assert settings == {"hooks": {"X": []}, "skipDangerousModePermissionPrompt": True}
    assert argv[argv.index("--model") + 1] == "sonnet" and argv[-1] == "--foo"
    assert "-p" not in argv and "--output-format" not in argv


# --------------------------------------------------------------------------- reading the screen


def test_an_empty_prompt_under_the_ready_footer_is_idle() -> None:
    screen = read_screen(claude_screen("● DONE ORANGE", "✻ Baked for 5s"))
    assert screen.ready and not screen.busy and screen.input_text == "" and screen.idle


def test_typed_text_in_the_prompt_box_is_not_idle() -> None:
    screen = read_screen(claude_screen(typed="hello there typed"))
    assert screen.ready and screen.input_text == "hello there typed" and not screen.idle


def test_text_that_wraps_inside_the_box_is_read_whole() -> None:
    text = "\n".join([RULE, f"❯{NBSP}first half of a long", "line that wrapped", RULE, FOOTER])
    assert read_screen(text).input_text == "first half of a long line that wrapped"


def test_busy_footer_is_not_idle_even_with_an_empty_prompt() -> None:
    screen = read_screen(claude_screen("  Bash(sleep 3; echo hi)", f"  ⎿ {NBSP}Running…",
                                       "✢ Canoodling… (2s · ↓ 13 tokens)", footer=BUSY_FOOTER))
    assert screen.ready and screen.busy and screen.input_text == "" and not screen.idle


def test_busy_words_in_the_conversation_do_not_count() -> None:
    screen = read_screen(claude_screen("● press esc to interrupt a turn, said the model"))
    assert screen.idle


def test_a_screen_without_the_prompt_box_is_not_idle() -> None:
    assert not read_screen("").idle
    assert not read_screen(" starting…\n").ready
    menu = "\n".join([RULE, " Which option?", " ❯ 1. first", "   2. second", RULE, FOOTER])
    assert read_screen(menu).input_text is None and not read_screen(menu).idle


@pytest.mark.parametrize(("lines", "name", "answerable"), [
    ([" Accessing workspace:", " Quick safety check: Is this a project you created or one you trust?",
      " ❯ No, exit", "   Yes, I trust this folder", " Enter to confirm · Esc to cancel"], "trust", True),
    ([" Accessing workspace:", " Quick safety check: Is this a project you created or one you trust?",
      "   No, exit", " ❯ Yes, I trust this folder", " Enter to confirm · Esc to cancel"], "trust_confirm", True),
    (["  WARNING: Claude Code running in Bypass Permissions mode", "  ❯ No, exit", "    Yes, I accept"],
     "bypass_warning", False),
    (["  Detected a custom API key in your environment", "  Do you want to use this API key?", "    Yes",
      "  ❯ No (recommended)"], "api_key", False),
    ([" Let's get started.", " Choose the text style that looks best with your terminal", " ❯ 2. Dark mode ✔"],
     "onboarding", False),
])
def test_start_up_dialogs_are_recognised(lines: list[str], name: str, answerable: bool) -> None:
    screen = read_screen("\n".join([RULE, *lines]))
    assert screen.blocker is not None and screen.blocker.name == name
    assert (screen.blocker.answer is not None) == answerable
    assert not screen.idle


def test_activity_ignores_the_spinner_and_timers_but_not_news() -> None:
    base = claude_screen("❯ run the echo", "● Bash(echo hi)", "✢ Canoodling… (2s · ↓ 13 tokens)", footer=BUSY_FOOTER)
    later = claude_screen("❯ run the echo", "● Bash(echo hi)", "✻ Canoodling… (9s · ↓ 40 tokens)", footer=BUSY_FOOTER)
    news = claude_screen("❯ run the echo", "● Bash(echo hi)", "  ⎿  hi", "✻ Canoodling… (9s)", footer=BUSY_FOOTER)
    assert activity_fingerprint(base) == activity_fingerprint(later)
    assert activity_fingerprint(base) != activity_fingerprint(news)


# --------------------------------------------------------------------------- fixtures (real tmux)


def wait_for(predicate: t.Callable[[], t.Any], timeout: float = 20.0, what: str = "condition") -> t.Any:
    """Poll until ``predicate`` is truthy (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_log(path: Path) -> list[dict[str, t.Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prompts(path: Path) -> list[dict[str, t.Any]]:
    return [e for e in read_log(path) if e["event"] == "prompt"]


def _socket_file(name: str) -> Path:
    return Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.geteuid()}" / name


@dataclass
class TmuxProject:
    project: ProjectPaths
    fake_claude: Path
    log: Path
    env: dict[str, str]

    def config(self, **runtime: t.Any) -> t.Any:
        from overstory.config.model import load_config

        config = load_config(self.project.config_file, self.project.local_config_file, environ={})
        config.runtime.claude_bin = str(self.fake_claude)
        config.sandbox.writable = [str(self.log.parent)]  # the fake TUI's log, written from inside its sandbox
        for key, value in runtime.items():
            setattr(config.runtime, key, value)
        return config

    def sling(self, task: str = "t1", *, capability: str = "builder", prompt: str = "do the thing",
              start: bool = True, extra_env: dict[str, str] | None = None, at_root: bool = False,
              **fake: str) -> t.Any:
        from overstory.agents.spawn import SlingRequest, sling
        from overstory.store.db import open_state

        environ = {**self.env, **(extra_env or {}),
                   **{f"FAKE_TUI_{key.upper()}": value for key, value in fake.items()}}
        conn = open_state(self.project.state_db)
        try:
            return sling(self.project, self.config(), conn,
                         SlingRequest(capability=capability, task_id=task, prompt=prompt, tmux=True,
                                      at_project_root=at_root),
                         environ, start=start)
        finally:
            conn.close()

    def row(self, name: str) -> sessions.Session:
        from overstory.store.db import open_state

        conn = open_state(self.project.state_db)
        try:
            row = sessions.get(conn, name)
        finally:
            conn.close()
        assert row is not None, f"no row for {name}"
        return row

    def mail(self, *, to: str, subject: str) -> list[int]:
        from overstory.store import mail
        from overstory.store.db import open_state

        conn = open_state(self.project.state_db)
        try:
            return mail.send(conn, sender="operator", to=to, subject=subject, body="body of " + subject)
        finally:
            conn.close()

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", socket_name(self.project), *args], capture_output=True, text=True,
                              timeout=10)

    def screen(self, name: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", f"={session_name(name)}:").stdout


@pytest.fixture
def tmux_project(project: ProjectPaths, tmp_path: Path) -> t.Iterator[TmuxProject]:
    need_program("tmux")
    fake = tmp_path / "bin" / "fake-claude"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {TESTS_DIR / 'fake_tui.py'} \"$@\"\n")
    fake.chmod(0o755)
    log = tmp_path / "fake-tui-log" / "fake-tui.jsonl"
    log.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env["FAKE_TUI_LOG"] = str(log)
    env["OV_SANDBOX_WRITABLE"] = json.dumps([str(log.parent)])  # for `ov` run as a command (config() sets it too)
    yield TmuxProject(project, fake, log, env)
    _reap(project)


def _reap(project: ProjectPaths) -> None:
    """Kill what the test's agents recorded (drivers, panes, tagged leftovers), then the server and its socket."""
    from overstory.store.db import open_state

    if project.state_db.exists():
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
    name = socket_name(project)
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, timeout=10)
    _socket_file(name).unlink(missing_ok=True)


def tui_pids(log: Path) -> list[int]:
    """Host pids of the live fake TUIs writing to ``log`` (inside its sandbox a TUI sees its own pid as 2)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fake_tui.py" in cmdline and f"FAKE_TUI_LOG={log}".encode() in environ and procs.is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def the_tui(log: Path) -> int:
    pids = wait_for(lambda: tui_pids(log), what="the fake TUI process")
    assert len(pids) == 1, pids
    return pids[0]


def pane_pid_alive(row: sessions.Session) -> bool:
    return procs.is_alive(row.turn_pgid, row.turn_start_ticks)


# --------------------------------------------------------------------------- the fake TUI alone (libtmux plugin)


@needs_tmux
def test_type_line_reaches_the_program_and_idle_follows_busy(server: t.Any, tmp_path: Path) -> None:
    """libtmux's `server` fixture (a throw-away socket): the screen rules against a running TUI."""
    log = tmp_path / "log.jsonl"
    command = f"env FAKE_TUI_LOG={log} FAKE_TUI_BUSY=1.5 {sys.executable} {TESTS_DIR / 'fake_tui.py'}"
    session = server.new_session(session_name="fake", window_command=command, x=120, y=30)
    pane = session.active_pane
    wait_for(lambda: read_screen("\n".join(pane.capture_pane())).idle, what="the fake TUI to be ready")
    tmux_mode.type_line(pane, "hello\nfrom a\ttest", tui=claude_tui.ClaudeTui())
    assert wait_for(lambda: prompts(log), what="the prompt")[0]["prompt"] == "hello from a test"
    wait_for(lambda: read_screen("\n".join(pane.capture_pane())).busy, what="busy")
    wait_for(lambda: read_screen("\n".join(pane.capture_pane())).idle, what="idle again")


# --------------------------------------------------------------------------- sling --tmux


def test_sling_tmux_starts_the_tui_types_the_dispatch_and_records_everything(tmux_project: TmuxProject) -> None:
    result = tmux_project.sling("t1")
    assert result.mode == "tmux" and result.tmux_session == "builder-t1"
    row = tmux_project.row("builder-t1")
    assert (row.state, row.mode, row.tmux_session) == ("working", "tmux", "builder-t1")
    assert pane_pid_alive(row) and tmux_panes.pane_alive(row) and tmux_panes.pane_status(row) == "alive"
    assert procs.is_alive(row.loop_pid, row.loop_start_ticks) and row.loop_pid == result.loop_pid
    pane_pid = tmux_project.tmux("display-message", "-p", "-t", "=builder-t1:", "#{pane_pid}").stdout.strip()
    assert int(pane_pid) == row.turn_pgid

    start = next(e for e in read_log(tmux_project.log) if e["event"] == "start")
    assert os.getpgid(the_tui(tmux_project.log)) == row.turn_pgid  # the TUI runs in the pane's process group
    assert start["cwd"] == str(tmux_project.project.worktree("builder-t1"))
    assert start["argv"][:2] == ["--permission-mode", "bypassPermissions"]
    assert json.loads(start["argv"][start["argv"].index("--settings") + 1])["skipDangerousModePermissionPrompt"]
    assert start["env"]["OVERSTORY_AGENT_NAME"] == "builder-t1"
    assert start["env"]["OVERSTORY_TURN_ID"] == tmux_panes.launch_tag(row.generation)
    assert start["env"][claude_tui.MARKETPLACE_VAR] == "1"

    # The SessionStart hook handed the dispatch mail to the "model"; the typed line says where to look.
    context = [e["text"] for e in read_log(tmux_project.log) if e["event"] == "context"]
    assert any("[ov mail]" in text and "task t1" in text and "do the thing" in text for text in context)
    first = wait_for(lambda: prompts(tmux_project.log), what="the typed dispatch")[0]["prompt"]
    assert first.startswith("[ov] You are builder-t1, a builder on task t1.")
    settings = json.loads(start["argv"][start["argv"].index("--settings") + 1])
    assert {"PreToolUse", "UserPromptSubmit", "SessionStart"} <= set(settings["hooks"])
    assert start["argv"][start["argv"].index("--setting-sources") + 1] == ""  # nothing in the worktree counts
    assert not (tmux_project.project.worktree("builder-t1") / ".claude/settings.local.json").exists()
    assert os.stat(tmux_panes.launch_file(tmux_project.project, "builder-t1")).st_mode & 0o077 == 0


def test_new_mail_is_typed_into_an_idle_pane_and_reaches_the_model(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    wait_for(lambda: prompts(tmux_project.log), what="the dispatch")
    tmux_project.mail(to="builder-t1", subject="also PURPLE")
    wake = wait_for(lambda: [p for p in prompts(tmux_project.log) if "new message" in p["prompt"]],
                    what="the mail notice")[0]
    assert wake["prompt"].startswith("[ov] You have 1 new message")
    assert any("also PURPLE" in text for text in wake["context"])  # injected by the UserPromptSubmit hook
    from overstory.store.db import open_state

    conn = open_state(tmux_project.project.state_db)
    try:
        assert conn.execute("SELECT count(*) FROM mail WHERE recipient='builder-t1' AND read_at IS NULL").fetchone()[0] == 0
    finally:
        conn.close()


def test_nothing_is_typed_while_the_pane_is_busy_or_holds_typed_text(tmux_project: TmuxProject) -> None:
    from overstory.store.db import open_state

    tmux_project.sling("t1", rules=json.dumps([{"match": "long job", "busy": 600}]))
    wait_for(lambda: prompts(tmux_project.log), what="the dispatch")
    wait_for(lambda: read_screen(tmux_project.screen("builder-t1")).idle, what="idle after the dispatch")
    # Make it busy for a long time, as a model working on something would be.
    tmux_project.tmux("send-keys", "-t", "=builder-t1:", "-l", "long job")
    tmux_project.tmux("send-keys", "-t", "=builder-t1:", "Enter")
    wait_for(lambda: read_screen(tmux_project.screen("builder-t1")).busy, what="busy")
    # Its UserPromptSubmit hook has run (it would hand over any mail sent before): now the mail waits.
    wait_for(lambda: [p for p in prompts(tmux_project.log) if p["prompt"] == "long job"], what="the hook")
    tmux_project.mail(to="builder-t1", subject="while busy")
    conn = open_state(tmux_project.project.state_db)
    try:
        assert tmux_mode.deliver_mail(tmux_project.project, conn, "builder-t1") == "busy"
        # An operator typing (attached) is never interrupted either: end the job, leave text in the box.
        tmux_project.tmux("send-keys", "-t", "=builder-t1:", "-l", "half typed")
        tmux_project.tmux("send-keys", "-t", "=builder-t1:", "Escape")
        wait_for(lambda: not read_screen(tmux_project.screen("builder-t1")).busy, what="the job to end")
        assert read_screen(tmux_project.screen("builder-t1")).input_text == "half typed"
        assert tmux_mode.deliver_mail(tmux_project.project, conn, "builder-t1") == "busy"
        assert not [p for p in prompts(tmux_project.log) if "new message" in p["prompt"]]
        # The box is emptied: now the driver announces the waiting mail.
        tmux_project.tmux("send-keys", "-t", "=builder-t1:", "-N", "10", "BSpace")
        wake = wait_for(lambda: [p for p in prompts(tmux_project.log) if "new message" in p["prompt"]],
                        what="the mail notice once idle")
        assert any("while busy" in text for text in wake[0]["context"])
        assert tmux_mode.deliver_mail(tmux_project.project, conn, "builder-t1") == "no_mail"
    finally:
        conn.close()


def test_ov_nudge_types_into_an_idle_tmux_pane(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    wait_for(lambda: read_screen(tmux_project.screen("builder-t1")).idle and prompts(tmux_project.log),
             what="idle after the dispatch")
    done = run_ov("nudge", "builder-t1", "report your status", "--json", cwd=tmux_project.project.root,
                  env=tmux_project.env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    # The driver may have been a moment faster: it typed the notice ("announced"), or the agent has
    # even read the mail already ("no_mail", seen under heavy load). The notice must still come once.
    assert answer["tmux_delivery"] in ("typed", "announced", "no_mail")
    wake = wait_for(lambda: [p for p in prompts(tmux_project.log) if "new message" in p["prompt"]], what="nudge")
    assert any("report your status" in text for text in wake[0]["context"])
    assert len(wake) == 1  # typed once, by whichever of nudge and the driver took the lock first


def test_terminal_mail_and_an_idle_pane_complete_the_agent_and_close_its_session(tmux_project: TmuxProject) -> None:
    report = "ov mail send --type worker_done --subject finished --body 'all done'"
    tmux_project.sling("t1", rules=json.dumps([{"match": "[ov] You are", "shell": report}]))
    wait_for(lambda: tmux_project.row("builder-t1").state == "completed", what="completed")
    row = tmux_project.row("builder-t1")
    wait_for(lambda: tmux_project.tmux("has-session", "-t", "=builder-t1").returncode != 0, what="session closed")
    wait_for(lambda: not tui_pids(tmux_project.log), what="the TUI to exit")
    wait_for(lambda: not procs.is_alive(row.loop_pid, row.loop_start_ticks), what="the driver to exit")
    finals = list(tmux_panes.logs_dir(tmux_project.project, "builder-t1").glob("*-final.txt"))
    assert finals and "[ov] You are builder-t1" in finals[0].read_text()
    from overstory.store.db import open_state

    conn = open_state(tmux_project.project.state_db)
    try:
        sent = conn.execute("SELECT sender, recipient FROM mail WHERE type = 'worker_done'").fetchall()
    finally:
        conn.close()
    assert [tuple(r) for r in sent] == [("builder-t1", "operator")]


def test_a_pane_whose_tui_exits_makes_the_agent_zombie_with_one_worker_died(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1", rules=json.dumps([{"match": "[ov] You are", "exit": 3}]))
    wait_for(lambda: tmux_project.row("builder-t1").state == "zombie", what="zombie")
    row = tmux_project.row("builder-t1")
    assert "its TUI exited with status 3" in (row.state_reason or "")
    wait_for(lambda: tmux_project.tmux("has-session", "-t", "=builder-t1").returncode != 0, what="session closed")
    from overstory.store.db import open_state

    conn = open_state(tmux_project.project.state_db)
    try:
        died = conn.execute("SELECT recipient, payload FROM mail WHERE type = 'worker_died'").fetchall()
        # A second zombie declaration (as the watchdog would make) sends nothing more.
        from overstory.store.lifecycle import declare_zombie

        assert not declare_zombie(conn, row, "again", actor="watchdog").ok
        assert conn.execute("SELECT count(*) FROM mail WHERE type = 'worker_died'").fetchone()[0] == 1
    finally:
        conn.close()
    assert len(died) == 1 and died[0]["recipient"] == "operator"
    assert "exited with status 3" in json.loads(died[0]["payload"])["reason"]


def test_watchdog_view_pane_gone_is_cheap_and_explained(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    row = tmux_project.row("builder-t1")
    procs.kill_group(row.loop_pid, row.loop_start_ticks, force=True)  # no driver: only the watchdog would notice
    tui = the_tui(tmux_project.log)
    os.kill(tui, signal.SIGKILL)  # the TUI crashes
    wait_for(lambda: not tmux_panes.pane_alive(row), what="pane_alive to turn false")
    assert tmux_panes.pane_status(row) == "gone"
    assert "its TUI was killed by signal 9" in tmux_panes.pane_exit_reason(tmux_project.project, row)
    report = tmux_panes.kill_session(tmux_project.project, row)
    assert report.session_killed and report.screen_saved
    assert tmux_project.tmux("has-session", "-t", "=builder-t1").returncode != 0


def test_a_killed_launcher_counts_as_gone_and_takes_the_tui_with_it(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    row = tmux_project.row("builder-t1")
    procs.kill_group(row.loop_pid, row.loop_start_ticks, force=True)
    tui = the_tui(tmux_project.log)
    os.kill(row.turn_pgid, signal.SIGKILL)  # ov's launcher is the pane's session leader: its death hangs up the TUI
    wait_for(lambda: not tmux_panes.pane_alive(row), what="pane_alive to turn false")
    wait_for(lambda: not procs.is_alive(tui), what="the TUI to end with its terminal")
    tmux_panes.kill_session(tmux_project.project, row, grace=1.0)
    assert tmux_server.list_sessions(tmux_project.project) == []


def test_a_stalled_agent_whose_pane_is_idle_goes_back_to_working(tmux_project: TmuxProject) -> None:
    from overstory.store.db import open_state

    tmux_project.sling("t1")
    row = tmux_project.row("builder-t1")
    conn = open_state(tmux_project.project.state_db)
    try:
        assert sessions.transition(conn, "builder-t1", row.generation, "stalled", actor="watchdog").ok
    finally:
        conn.close()
    wait_for(lambda: tmux_project.row("builder-t1").state == "working", what="the driver to revive it")


def test_kill_session_ends_the_tui_and_its_escaped_tool_shells_but_not_a_decoy(tmux_project: TmuxProject) -> None:
    # Like Claude's Bash tool, the shell runs in a new session: killing the TUI's group does not reach it.
    escaped = "setsid sleep 987654 > /dev/null 2>&1 < /dev/null &"
    tmux_project.sling("t1", rules=json.dumps([{"match": "[ov] You are", "shell": escaped}]))
    root = str(tmux_project.project.root).encode()

    def escaped_shells() -> list[int]:
        return [pid for pid in _pids_with_argv([b"sleep", b"987654"])
                if b"OVERSTORY_PROJECT_ROOT=" + root in _environ(pid)]

    tagged = wait_for(escaped_shells, what="the escaped tool shell")
    # A decoy with the same command line and working directory, not started by the agent.
    decoy = subprocess.Popen(["sleep", "987654"], cwd=tmux_project.project.worktree("builder-t1"),
                             start_new_session=True)
    try:
        row = tmux_project.row("builder-t1")
        # Stop the driver first: it would otherwise notice the closed pane and clean up in
        # parallel, and this test is about kill_session's own search for tagged processes.
        procs.kill_group(row.loop_pid, row.loop_start_ticks, force=True)
        report = tmux_panes.kill_session(tmux_project.project, row, grace=1.0)
        # In a sandbox the shell dies with the TUI's pid namespace; without one the tagged search finds it.
        assert decoy.pid not in report.leftovers
        wait_for(lambda: not any(procs.is_alive(pid) for pid in tagged), what="the leftovers to die")
        assert not pane_pid_alive(row)
        assert procs.is_alive(decoy.pid)
    finally:
        decoy.kill()
        decoy.wait()


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _pids_with_argv(argv: list[bytes]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().split(b"\0")[:-1] == argv:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _is_driver_of(pid: int, project: ProjectPaths) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"overstory.agents.tmux.session" in argv and b"drive" in argv and str(project.root).encode() in argv


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


# --------------------------------------------------------------------------- start-up failures


def assert_nothing_left(tmux_project: TmuxProject, name: str = "builder-t1") -> None:
    project = tmux_project.project
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        assert sessions.get(conn, name) is None
        assert conn.execute("SELECT count(*) FROM mail WHERE recipient = ?", (name,)).fetchone()[0] == 0
    finally:
        conn.close()
    assert not project.worktree(name).exists()
    assert run_git(project.root, "branch", "--list", f"ov/{name}").strip() == ""
    assert tmux_server.list_sessions(project) == []
    wait_for(lambda: not tui_pids(tmux_project.log), what="no fake TUI alive")


@pytest.mark.parametrize(("fake", "message"), [
    ({"exit": "2"}, "exited with status 2 during start-up"),
    ({"dialog": "api_key"}, "API_KEY"),
    ({"dialog": "onboarding"}, "first-run set-up"),
    ({"dialog": "bypass"}, "Bypass Permissions warning"),
])
def test_a_tui_that_cannot_start_fails_the_sling_and_leaves_nothing(tmux_project: TmuxProject,
                                                                     fake: dict[str, str], message: str) -> None:
    with pytest.raises(TmuxError) as failure:
        tmux_project.sling("t1", **fake)
    assert message in str(failure.value) and "builder-t1" in str(failure.value)
    assert "screen saved to" in str(failure.value)
    assert_nothing_left(tmux_project)
    assert tmux_project.sling("t1").mode == "tmux"  # the same command works once the cause is gone


def test_the_trust_question_for_the_new_worktree_is_answered(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1", dialog="trust")
    assert tmux_project.row("builder-t1").state == "working"
    log = read_log(tmux_project.log)
    # "No, exit" is selected first and the first key is dropped (as in 2.1.330): ov types Down again.
    assert [e["key"] for e in log if e["event"] == "dialog_key_dropped"] == ["\x1b[B"]
    assert [(e["dialog"], e["answer"]) for e in log if e["event"] == "dialog"] == [("trust",
                                                                                   "Yes, I trust this folder")]


def test_readiness_times_out_with_a_clear_error(tmux_project: TmuxProject) -> None:
    from overstory.store.db import open_state

    tmux_project.sling("t1", start=False)
    conn = open_state(tmux_project.project.state_db)
    try:
        with pytest.raises(TmuxError, match=r"did not show its ready prompt within 1\.5s"):
            tmux_mode.start_agent(tmux_project.project, tmux_project.config(), conn, "builder-t1", 1,
                                  {**tmux_project.env, "FAKE_TUI_NEVER_READY": "1"}, ready_timeout=1.5)
        assert sessions.get(conn, "builder-t1").state == "booting"  # the caller (sling) undoes the row
    finally:
        conn.close()
    assert tmux_server.list_sessions(tmux_project.project) == []


def test_a_failure_after_the_start_undoes_the_tmux_agent(tmux_project: TmuxProject) -> None:
    from overstory.agents.spawn import FAULT_ENV
    from overstory.errors import SpawnError

    with pytest.raises(SpawnError, match="after_start"):
        tmux_project.sling("t1", extra_env={FAULT_ENV: "after_start"})
    assert_nothing_left(tmux_project)
    assert not [pid for pid in _all_pids() if _is_driver_of(pid, tmux_project.project)]


# --------------------------------------------------------------------------- the CLI


def test_cli_sling_tmux_then_attach_prints_the_command(tmux_project: TmuxProject) -> None:
    env = {**tmux_project.env, "OV_RUNTIME_CLAUDE_BIN": str(tmux_project.fake_claude)}
    done = run_ov("sling", "builder", "t1", "--tmux", "--prompt", "go", cwd=tmux_project.project.root, env=env)
    assert done.returncode == 0, done.stderr
    assert "ov attach builder-t1" in done.stdout
    attach = run_ov("attach", "builder-t1", cwd=tmux_project.project.root, env=env)
    assert attach.returncode == 0, attach.stderr
    command = attach.stdout.strip()
    assert command.endswith(f"-L {socket_name(tmux_project.project)} attach-session -t =builder-t1")
    as_json = json.loads(run_ov("attach", "builder-t1", "--json", cwd=tmux_project.project.root, env=env).stdout)
    assert as_json["tmux_session"] == "builder-t1"


def test_config_runtime_tmux_makes_tmux_the_default(tmux_project: TmuxProject) -> None:
    tmux_project.project.local_config_file.write_text(
        f"runtime:\n  tmux: true\n  claude_bin: {tmux_project.fake_claude}\n", encoding="utf-8")
    done = run_ov("sling", "builder", "t1", "--json", cwd=tmux_project.project.root, env=tmux_project.env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["mode"] == "tmux"
    headless = run_ov("sling", "scout", "t2", "--runtime", "scripted", "--json", cwd=tmux_project.project.root,
                      env=tmux_project.env)
    assert headless.returncode == 0, headless.stderr
    assert json.loads(headless.stdout)["mode"] == "headless"  # the scripted runtime has no TUI


def test_tmux_with_the_scripted_runtime_is_a_usage_error(project: ProjectPaths) -> None:
    done = run_ov("sling", "builder", "t1", "--tmux", "--runtime", "scripted", cwd=project.root)
    assert done.returncode == 2 and "headless only" in done.stderr


def test_attach_refuses_headless_and_unknown_agents(project: ProjectPaths) -> None:
    done = run_ov("sling", "scout", "t1", "--runtime", "scripted", cwd=project.root)
    assert done.returncode == 0, done.stderr
    headless = run_ov("attach", "scout-t1", cwd=project.root)
    assert headless.returncode == 1 and "headless" in headless.stderr
    unknown = run_ov("attach", "nobody", cwd=project.root)
    assert unknown.returncode == 1 and "no agent named" in unknown.stderr
    run_ov("stop", "scout-t1", "--force", cwd=project.root)


def test_orphan_sessions_are_the_ones_no_active_agent_owns(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    server = tmux_server.server(tmux_project.project)
    server.new_session(session_name="stray", window_command="sleep 600")
    from overstory.store.db import open_state

    conn = open_state(tmux_project.project.state_db)
    try:
        assert tmux_panes.orphan_sessions(tmux_project.project, conn) == ["stray"]
    finally:
        conn.close()
    assert tmux_server.kill_session_by_name(tmux_project.project, "stray")
    assert tmux_server.list_sessions(tmux_project.project) == ["builder-t1"]


def test_cli_runner_attach_prints_when_stdout_is_not_a_terminal(tmux_project: TmuxProject,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.cli.main import cli

    tmux_project.sling("t1")
    monkeypatch.chdir(tmux_project.project.root)
    result = CliRunner().invoke(cli, ["attach", "builder-t1", "--read-only"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.output.strip().endswith("attach-session -r -t =builder-t1")


def test_ov_stop_leaves_no_tui_no_driver_and_no_session(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    row = tmux_project.row("builder-t1")
    tui = the_tui(tmux_project.log)
    done = run_ov("stop", "builder-t1", cwd=tmux_project.project.root, env=tmux_project.env)
    assert done.returncode == 0, done.stderr
    assert tmux_project.row("builder-t1").state == "completed"
    wait_for(lambda: tmux_server.list_sessions(tmux_project.project) == [], what="the session to close")
    for pid, ticks in ((tui, None), (row.turn_pgid, row.turn_start_ticks), (row.loop_pid, row.loop_start_ticks)):
        wait_for(lambda: not procs.is_alive(pid, ticks), what=f"process {pid} to end")


def test_an_agent_at_the_project_root_gets_its_instructions_and_hooks_as_flags(tmux_project: TmuxProject) -> None:
    result = tmux_project.sling("c1", capability="coordinator", at_root=True)
    assert result.mode == "tmux" and result.worktree is None
    start = next(e for e in read_log(tmux_project.log) if e["event"] == "start")
    assert start["cwd"] == str(tmux_project.project.root)
    argv = start["argv"]
    instructions = Path(argv[argv.index("--append-system-prompt-file") + 1])
    assert instructions.parent == tmux_project.project.run_dir / "coordinator-c1"
    assert "coordinator" in instructions.read_text()
    assert argv[argv.index("--setting-sources") + 1] == ""
    settings = json.loads(argv[argv.index("--settings") + 1])
    assert {"PreToolUse", "UserPromptSubmit", "SessionStart"} <= set(settings["hooks"])
    first = wait_for(lambda: prompts(tmux_project.log), what="the typed dispatch")[0]["prompt"]
    assert "Your instructions are in your system prompt" in first
    assert not (tmux_project.project.root / ".claude").exists()  # nothing written into the user's own .claude/


def _watchdog_tick(project: ProjectPaths) -> list[t.Any]:
    from overstory.config.model import load_config
    from overstory.watchdog.daemon import Watchdog, WatchdogSettings

    dog = Watchdog(project, WatchdogSettings.from_config(load_config(project.config_file, project.local_config_file)))
    try:
        return dog.tick()
    finally:
        dog.close()


def test_watchdog_makes_a_tmux_agent_with_a_dead_pane_and_driver_zombie(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    row = tmux_project.row("builder-t1")
    procs.kill_group(row.loop_pid, row.loop_start_ticks, force=True)  # the driver is gone too
    tui = the_tui(tmux_project.log)
    os.kill(tui, signal.SIGKILL)
    wait_for(lambda: tmux_panes.pane_status(row) == "gone", what="pane gone")
    actions = _watchdog_tick(tmux_project.project)
    assert [a.kind for a in actions if a.agent == "builder-t1"] == ["zombie"]
    assert tmux_project.row("builder-t1").state == "zombie"
    assert tmux_project.tmux("has-session", "-t", "=builder-t1").returncode != 0
    assert _watchdog_tick(tmux_project.project) == []  # settled: nothing more, no second worker_died
    from overstory.store.db import open_state

    conn = open_state(tmux_project.project.state_db)
    try:
        assert conn.execute("SELECT count(*) FROM mail WHERE type = 'worker_died'").fetchone()[0] == 1
    finally:
        conn.close()


def test_watchdog_restarts_a_dead_tmux_driver(tmux_project: TmuxProject) -> None:
    tmux_project.sling("t1")
    row = tmux_project.row("builder-t1")
    procs.kill_group(row.loop_pid, row.loop_start_ticks, force=True)
    wait_for(lambda: not procs.is_alive(row.loop_pid, row.loop_start_ticks), what="driver gone")
    actions = _watchdog_tick(tmux_project.project)
    assert [a.kind for a in actions if a.agent == "builder-t1"] == ["readopted"]
    wait_for(lambda: (r := tmux_project.row("builder-t1")).loop_pid != row.loop_pid
             and procs.is_alive(r.loop_pid, r.loop_start_ticks), what="a new driver")
    assert tmux_project.row("builder-t1").state == "working"
