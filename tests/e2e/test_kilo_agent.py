"""Kilo agents driven by the real `ov sling`, `ov mail` and agent loop, with the REAL Kilo CLI.

Only the model is mocked (tests/mock_openai_chat.py on 127.0.0.1): there is no model to call offline.
`kilo run`, its tools, ov's guard plugin (`tool.execute.before` calling `ov guard`), its session store
and `--session`, git, SQLite, bubblewrap and every process are real. The project reaches the mock the
way a user reaches any OpenAI-compatible endpoint: a `providers` entry in config.

CI time is tight (a kilo run costs a minute of wall time), so each kilo run proves several behaviours:
- the two failure runs (a 401 parks for auth, a stalled model ends in one worker_died) share the test below;
- the working builder runs in tests/e2e/test_mixed_team.py (test_claude_coordinator_kilo_and_qwen_builders),
  slung by a Claude coordinator: a 5xx retried by kilo, its second turn resuming the same session (the
  operator's answer), writes outside the worktree refused (guard plugin and sandbox), receipts from exit
  codes, the provider's key and ov's instructions, kilo's own sub-agents and board off, the commit and the
  worker_done report, tokens priced from ov's table, and ~/.config/kilo left alone.
"""

from __future__ import annotations

import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from kilo_cli import KILO_BIN, MODEL_ID, requires_kilo
from mock_openai_chat import MockChatAPI, error_reply, stalled_reply
from overstory import procs
from overstory.paths import ProjectPaths
from runtime_agents import MOCK_PRICE, OFFLINE_ENV, configure, events, sling, turn_rows

PROMPT = "Add a greet() function in greet.py and commit it."
KEY = "sk-mock-kilo-builder"


def setup(project: ProjectPaths, apis: dict[str, MockChatAPI], **turns: t.Any) -> dict[str, str]:
    """One provider per mock (``{provider: api}``); every builder runs on kilo."""
    configure(project, runtimes={"builder": "kilo"},
              providers={name: {"base_url": api.base_url, "api_key_env": "MOCK_CHAT_KEY", "protocol": "openai-chat"}
                         for name, api in apis.items()},
              models={"builder": f"{next(iter(apis))}/{MODEL_ID}"}, prices={MODEL_ID: MOCK_PRICE},
              runtime={"kilo_bin": KILO_BIN or "kilo"}, turns=turns)
    return {**OFFLINE_ENV, "MOCK_CHAT_KEY": KEY}


@requires_kilo
def test_kilo_401_parks_for_auth_and_a_stalled_model_dies_once(project: ProjectPaths) -> None:
    with MockChatAPI([error_reply(401, "Incorrect API key provided", "invalid_request_error")]) as bad, \
            MockChatAPI([stalled_reply(None)]) as stalled:
        # Each agent's config is snapshotted at its sling: the 401 one keeps the default stall timeout (a
        # start can take a minute on a loaded machine), the stalled one gets a short one.
        parked = sling(project, "builder", "task-1", PROMPT, setup(project, {"badkey": bad, "stuck": stalled}))
        zombie = sling(project, "builder", "task-2", PROMPT,
                       setup(project, {"badkey": bad, "stuck": stalled}, stall_timeout=30, kill_grace=1),
                       "--model", f"stuck/{MODEL_ID}")
        agent = wait_for(lambda: (a := agent_state(project, parked)) and a.state == "parked" and a, 150,
                         message="parked")
        dead = wait_terminal(project, zombie, timeout=180)
        turn = turn_rows(project, zombie)[0]
        assert dead.state == "zombie" and "stall" in dead.state_reason
        assert not procs.group_members(turn["pgid"]) and not procs.tagged_processes(turn["id"])
    ended = events(project, parked, "turn_end")
    assert ended and ended[-1][1]["failure"] == "auth" and "Incorrect API key" in ended[-1][1]["reason"]
    assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: ")
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"
    assert len(mail_rows(project, type="escalation")) == 1


@pytest.fixture(autouse=True)
def _user_config_untouched() -> t.Iterator[None]:
    """kilo must never touch the developer's own config (ov gives each agent its own HOME and XDG dirs)."""
    watched = [Path.home() / ".kilo", Path.home() / ".kilocode", Path.home() / ".config" / "kilo",
               Path.home() / ".local" / "share" / "kilo"]
    before = {str(p): sorted(x.name for x in p.iterdir()) if p.is_dir() else None for p in watched}
    yield
    assert {str(p): sorted(x.name for x in p.iterdir()) if p.is_dir() else None for p in watched} == before
