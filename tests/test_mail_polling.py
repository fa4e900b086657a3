"""An agent polling for mail in a shell loop: the matcher (guards.mail_poll), the `mail_polling` event the loop
records from the turn's stream (warn, the default), and the guard's refusal with `guards.mail_polling: refuse`.
The agent runs on the scripted runtime, whose bash actions go through the same hooks and sandbox as claude's."""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest
import yaml

from agent_helpers import wait_terminal, write_scenario
from conftest import run_ov
from overstory.guards.mail_poll import REFUSAL, polls_mail
from overstory.paths import ProjectPaths

POLLS = [
    "sleep 5; ov mail check",
    "sleep 30 && ov mail check --json",
    "sleep 60\nov mail check",
    "ov mail check; sleep 10",
    "ov mail list --unread; sleep 5",
    "while true; do ov mail check; sleep 5; done",
    "while :; do ov --project . mail check; done",
    "while ! ov mail check | grep -q worker_done; do sleep 2; done",
    "until ov mail check --json | grep -q merged; do sleep 1; done",
    "for i in $(seq 10); do ov mail check; sleep 3; done",
    "watch ov mail check",
    "watch -n 5 ov mail check",
    "timeout 300 bash -c 'while true; do ov mail check; sleep 5; done'",
]
DOES_NOT_POLL = [
    "ov mail check",
    "ov mail check --json | jq .",
    "sleep 2 && make",
    "ov mail check && make test",
    "make; ov mail check",
    "ov mail check; ov mail list",
    "sleep 60; ov mail send --to lead --subject s --body hi",
    "ov mail reply 3 --body 'done'; sleep 1",
    "for f in *.py; do python -m py_compile $f; done; ov mail check",
    "git commit -m 'while true; do ov mail check; sleep 1; done'",
    'ov mail send --to lead --subject s --body "I will not sleep 5; ov mail check in a loop"',
    "echo sleeping",
]


@pytest.mark.parametrize("command", POLLS)
def test_polling_commands_match(command: str) -> None:
    assert polls_mail(command)


@pytest.mark.parametrize("command", DOES_NOT_POLL)
def test_other_commands_do_not(command: str) -> None:
    assert not polls_mail(command)


POLL = "sleep 0.1; ov mail check"
REPORT = 'ov mail send --type worker_done --subject "done ${OVERSTORY_AGENT_NAME}" --body ok'


def run_builder(project: ProjectPaths, tmp_path: Path, task: str) -> list[dict[str, t.Any]]:
    """A scripted builder that checks its mail once (fine), polls once, runs `sleep && git status` (fine) and
    reports; returns its events."""
    scenario = write_scenario(tmp_path / f"{task}.json", [{"actions": [
        {"bash": "ov mail check"}, {"bash": POLL}, {"bash": "sleep 0.1 && git status --short"}, {"bash": REPORT},
    ], "result": "done"}])
    slung = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(scenario), cwd=project.root)
    assert slung.returncode == 0, slung.stderr
    agent = wait_terminal(project, f"builder-{task}")
    assert agent.state == "completed", agent.state_reason
    logs = run_ov("logs", f"builder-{task}", "--json", "-n", "500", cwd=project.root)
    assert logs.returncode == 0, logs.stderr
    return [json.loads(line) for line in logs.stdout.splitlines() if line.strip()]


def test_a_polling_bash_call_is_one_warning_event_and_still_runs(project: ProjectPaths, tmp_path: Path) -> None:
    events = run_builder(project, tmp_path, "warned")
    polling = [e for e in events if e["kind"] == "mail_polling"]
    assert len(polling) == 1, polling
    assert POLL in polling[0]["summary"] and polling[0]["data"]["command"] == POLL
    ends = [e for e in events if e["kind"] == "tool_end"]
    assert not any(REFUSAL[:40] in json.dumps(e) for e in ends), "warn (the default) lets the command run"

    only = run_ov("logs", "builder-warned", "--kind", "mail_polling", "--json", cwd=project.root)
    assert only.returncode == 0 and len(only.stdout.strip().splitlines()) == 1


def test_refuse_denies_the_poll_and_tells_the_agent_why(project: ProjectPaths, tmp_path: Path) -> None:
    project.local_config_file.write_text(yaml.safe_dump({"guards": {"mail_polling": "refuse"}}), encoding="utf-8")
    events = run_builder(project, tmp_path, "refused")
    assert len([e for e in events if e["kind"] == "mail_polling"]) == 1
    refused = [e for e in events if e["kind"] == "tool_end" and REFUSAL[:40] in json.dumps(e)]
    assert len(refused) == 1, [e for e in events if e["kind"] == "tool_end"]
    assert "sleep 0.1 && git status" not in json.dumps(refused)
