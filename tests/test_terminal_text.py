"""Issue 28, item 4: text an agent wrote never reaches the operator's terminal raw.

A scripted agent (real loop, real guard, real sandbox, real SQLite) plants hostile text
through the paths agents really write by: a gated command (an approval request), mail
(subject and body), its own words, a tool's output, the progress file and last words of an `ov loop`. Then every command that shows such text runs as a
real `ov` subprocess, and its output must hold no raw control character (C0 but newline
and tab, DEL, C1, bidirectional overrides) while the text is still there, escaped.
`ov watch`'s interactive screen is checked in-process (its escape codes must all be
rich's own colors), and a few commands also run on a pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import typing as t

import pytest
import yaml

from agent_helpers import agent_state, wait_for
from conftest import ov_command, run_ov
from overstory.paths import ProjectPaths
from test_watchdog import write_local_config

# Erase the line, return to its start, go one line up (and draw a fake request there); then bell,
# a C1 CSI, a right-to-left override, DEL, a newline with a fake `ov approve` line, rich markup.
ERASE = "\x1b[2K\r\x1b[1A"
HOSTILE = (f"deploy --prod {ERASE}harmless request\x07\x9b2J\u202eevil\x7f"
           "\n    ov approve apr-fake [bold red]MARKUP[/]")
# How the text must show: escaped (event lists collapse runs of white space, CR included, to one space).
VISIBLE = "\\x1b[2K"
JSON_VISIBLE = "\\u001b[2K\\r\\u001b[1A"
FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
MARKUP = "[bold red]MARKUP[/] [link=http://example.invalid]click[/link] status"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # color codes rich writes on a terminal


def raw_controls(text: str) -> list[str]:
    return sorted({repr(c) for c in FORBIDDEN.findall(text)})


@pytest.fixture
def planted(project: ProjectPaths, tmp_path: t.Any) -> dict[str, str]:
    """A parked agent with a pending gate, mail, events, ledger rows and a finished `ov loop`, all hostile."""
    write_local_config(project, approvals={"rules": [{"match": "Bash(echo deploy*)"}]},
                       turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 2},
                       watchdog={"interval": 0.2})
    quoted = HOSTILE.replace("'", "")
    plan = tmp_path / "hostile.yaml"
    plan.write_text(yaml.safe_dump({"agents": {
        "builder-t1": {"turns": [{"actions": [
            {"text": HOSTILE},
            {"bash": f"echo '{quoted}'"},
            {"bash": f"ov mail send --to operator --type question --subject '{quoted}' --body 'body: {quoted}'"},
            {"bash": f"ov mail send --to operator --subject '{MARKUP}' --body markup"},
            {"bash": f"echo {quoted}"},  # gated: the approval request carries the command as the agent wrote it
        ], "result": "waiting"}]},
        "builder-t2": {"iterations": [{"actions": [
            {"write": {"path": ".overstory-progress.md", "content": f"{HOSTILE}\n"}}],
            "result": f"{HOSTILE} LOOP_DONE"}]},
    }}, allow_unicode=True))
    slung = run_ov("sling", "builder", "t1", "--runtime", "scripted", "--scenario", str(plan), cwd=project.root)
    assert slung.returncode == 0, slung.stderr
    looped = run_ov("loop", "builder", "t2", "--runtime", "scripted", "--scenario", str(plan), "--prompt", "look",
                    "--check", "true", cwd=project.root)
    assert looped.returncode == 0, looped.stderr
    wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "parked", 60, interval=0.1,
             message="the builder to park on its gate")
    wait_for(lambda: (a := agent_state(project, "builder-t2")) and a.is_terminal, 60, interval=0.1,
             message="the loop to finish")
    listed = json.loads(run_ov("mail", "list", "--json", "--type", "question", cwd=project.root).stdout)
    assert listed and listed[0]["subject"] == quoted, "the subject was stored as the agent wrote it"
    return {"agent": "builder-t1", "loop": "builder-t2", "mail": str(listed[0]["id"])}


def commands(names: dict[str, str]) -> dict[str, list[str]]:
    return {
        "approvals": ["approvals"],
        "status": ["status"],
        "status --all": ["status", "--all"],
        "mail list": ["mail", "list"],
        "mail read": ["mail", "read", names["mail"]],
        "mail check": ["mail", "check", "--peek"],
        "mail check --inject": ["mail", "check", "--inject", "--peek"],
        "trace": ["trace", names["agent"]],
        "logs": ["logs", names["agent"]],
        "feed": ["feed"],
        "watch --once": ["watch", "--once", "--width", "220"],
        "loop status": ["loop", "status", names["loop"]],
    }  # `ov costs` and `ov tree` show no text an agent chooses (names are validated; models come from the API)


JSON_COMMANDS = {"status --json": ["status", "--json"], "approvals --json": ["approvals", "--json"],
                 "logs --json": ["logs", "builder-t1", "--json"], "mail list --json": ["mail", "list", "--json"]}


def test_every_command_shows_agents_text_escaped(planted: dict[str, str], project: ProjectPaths) -> None:
    problems = {}
    for label, args in commands(planted).items():
        done = run_ov(*args, cwd=project.root, env={"COLUMNS": "220"})
        assert done.returncode == 0, (label, done.stderr)
        found = raw_controls(done.stdout + done.stderr)
        if found or VISIBLE not in done.stdout:
            problems[label] = (found, done.stdout[-600:])
    for label, args in JSON_COMMANDS.items():
        done = run_ov(*args, cwd=project.root)
        assert done.returncode == 0, (label, done.stderr)
        found = raw_controls(done.stdout)
        if found or JSON_VISIBLE not in done.stdout:
            problems[label] = (found, done.stdout[-600:])
        for text in (done.stdout.splitlines() if label == "logs --json" else [done.stdout]):
            json.loads(text)  # still JSON, with the same strings
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())


def test_rich_markup_in_agents_text_is_shown_not_interpreted(planted: dict[str, str], project: ProjectPaths) -> None:
    frame = run_ov("watch", "--once", "--width", "220", cwd=project.root).stdout
    assert MARKUP in frame, frame  # in the mail table: a subject is a string rich would read as markup


def test_the_interactive_watch_screen_draws_only_its_own_escape_codes(planted: dict[str, str],
                                                                      project: ProjectPaths) -> None:
    from overstory.cli.watch_tui import WatchApp
    from overstory.store.db import open_events, open_state

    state, events = open_state(project.state_db), open_events(project.events_db)
    try:
        app = WatchApp(project, state, events, interval=1.0, note=lambda: "")
        screens = {"list": app.screen(200, 60)}
        app.selected = planted["agent"]
        app.open_stream(planted["agent"])
        screens["stream"] = app.screen(200, 60)
        app.status = "failed: " + HOSTILE  # what a finished action reports (its output may quote agents)
        screens["status line"] = app.screen(200, 60)
    finally:
        state.close()
        events.close()
    for name, lines in screens.items():
        text = "\n".join(lines)
        assert not raw_controls(SGR.sub("", text)), (name, raw_controls(SGR.sub("", text)))
        assert "\\x1b[2K" in text, name


def on_terminal(args: list[str], cwd: t.Any) -> str:
    """``ov ARGS`` with stdout and stderr on a pseudo-terminal; everything it wrote."""
    leader, follower = os.openpty()
    proc = subprocess.Popen([*ov_command(), *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=follower, env={**os.environ, "COLUMNS": "220"})
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            proc.kill()
            raise AssertionError(f"ov {args} wrote nothing for 30 s")
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def test_on_a_terminal_too(planted: dict[str, str], project: ProjectPaths) -> None:
    for args in (["approvals"], ["status"], ["mail", "list"], ["mail", "read", planted["mail"]]):
        text = on_terminal(args, project.root)
        assert not raw_controls(SGR.sub("", text)), (args, raw_controls(text))
        assert VISIBLE in text, args


def test_the_helper_escapes_every_control_and_keeps_the_rest() -> None:
    from overstory import printable

    assert printable.line(HOSTILE).count("\n") == 0 and not raw_controls(printable.line(HOSTILE))
    assert "\\x1b[2K\\r\\x1b[1A" in printable.line(HOSTILE) and "\\n    ov approve" in printable.line(HOSTILE)
    assert printable.block("a\tb\nc\r\x1b") == "a\tb\nc\\r\\x1b"
    assert printable.line("plain, ünïcode 😀 and a\\back\\slash") == "plain, ünïcode 😀 and a\\back\\slash"
    dumped = json.dumps({"call": HOSTILE}, ensure_ascii=False)
    assert not raw_controls(printable.json_text(dumped)) and json.loads(printable.json_text(dumped)) == {"call": HOSTILE}
    colored = printable.colored_block("\x1b[32m+ok\x1b[m\n+\x1b[2Kbad\r")
    assert colored == "\x1b[32m+ok\x1b[m\n+\\x1b[2Kbad\\r"
