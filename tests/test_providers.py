"""Providers and models per capability: the turn runner routes each agent to its own endpoint."""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest

from agent_helpers import wait_terminal
from conftest import run_git, run_ov
from overstory.agents.turns import model_choice, resolve_model_and_provider, run_turn
from overstory.config.model import Config, load_config
from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_events, open_state
from test_coordinator import (
    scenario,
    sling_cmd,
    team,  # noqa: F401 - fixture
    wait_idle,
    write_local_config,
)

PROVIDERS = {"mockc": {"base_url": "http://127.0.0.1:1/c", "api_key_env": "MOCKC_KEY"},
             "mockb": {"base_url": "http://127.0.0.1:1/b", "api_key_env": "MOCKB_KEY"}}


def _config(**sections: t.Any) -> Config:
    return Config.model_validate(sections)


# ---- choosing the model and provider ----------------------------------------------------------------


def test_plain_models_by_precedence() -> None:
    assert model_choice(None, "builder", _config(), {}) == ("sonnet", {}), "builders default to a cheaper model"
    assert model_choice(None, "scout", _config(), {}) == ("haiku", {})
    assert model_choice(None, "lead", _config(), {}) == (None, {}), "other capabilities: the CLI's default"
    assert model_choice(None, "builder", _config(models={}), {}) == (None, {})
    config = _config(runtime={"model": "sonnet"}, models={"builder": "opus"})
    assert model_choice(None, "builder", config, {}) == ("opus", {})
    assert model_choice(None, "scout", config, {}) == ("sonnet", {})
    assert model_choice("haiku", "builder", config, {}) == ("haiku", {}), "sling --model wins"


def test_provider_model_sets_base_url_and_key() -> None:
    config = _config(providers=PROVIDERS, models={"coordinator": "mockc/x", "builder": "mockb/y"})
    env = {"MOCKC_KEY": "kc", "MOCKB_KEY": "kb", "ANTHROPIC_API_KEY": "the-real-one"}
    assert model_choice(None, "coordinator", config, env) == (
        "x", {"ANTHROPIC_BASE_URL": "http://127.0.0.1:1/c", "ANTHROPIC_API_KEY": "kc"})
    assert model_choice(None, "builder", config, env) == (
        "y", {"ANTHROPIC_BASE_URL": "http://127.0.0.1:1/b", "ANTHROPIC_API_KEY": "kb"})
    assert model_choice("mockc/anthropic/claude-x", "builder", config, env)[0] == "anthropic/claude-x"
    assert model_choice("mockb/", "builder", config, env)[0] is None, "the provider's default model"


def test_unknown_provider_and_missing_key_are_clear_errors() -> None:
    config = _config(providers=PROVIDERS, models={"builder": "nope/y"})
    with pytest.raises(OrchestratorError, match=r"provider 'nope'.*not in config `providers` \(mockb, mockc\)"):
        model_choice(None, "builder", config, {})
    with pytest.raises(OrchestratorError, match=r"\$MOCKB_KEY, which is not set"):
        model_choice("mockb/y", "builder", config, {"ANTHROPIC_API_KEY": "must not be sent to mockb"})


def test_resolve_uses_the_agent_row(state_db: t.Any) -> None:
    sessions.create_session(state_db, name="builder-a", capability="builder", task_id="a", runtime="scripted",
                            actor="test", model="mockc/z")
    agent = sessions.get(state_db, "builder-a")
    config = _config(providers=PROVIDERS, models={"builder": "mockb/y"})
    assert resolve_model_and_provider(agent, config, {"MOCKC_KEY": "kc"}) == (
        "z", {"ANTHROPIC_BASE_URL": "http://127.0.0.1:1/c", "ANTHROPIC_API_KEY": "kc"})


def test_sling_refuses_a_broken_provider_before_creating_anything(project: ProjectPaths) -> None:
    write_local_config(project, providers=PROVIDERS, models={"builder": "nope/y", "scout": "mockb/y"})
    refused = run_ov("sling", "builder", "t1", "--runtime", "scripted", cwd=project.root)
    assert refused.returncode == 1 and "not in config `providers`" in refused.stderr
    no_key = run_ov("sling", "scout", "t2", "--runtime", "scripted", cwd=project.root)
    assert no_key.returncode == 1 and "$MOCKB_KEY, which is not set" in no_key.stderr
    assert run_git(project.root, "branch", "--list", "ov/*").strip() == ""


def test_a_provider_that_breaks_after_sling_ends_the_turn_as_permanent(project: ProjectPaths, state_db: t.Any) -> None:
    sessions.create_session(state_db, name="builder-a", capability="builder", task_id="a", runtime="scripted",
                            actor="test", model="gone/x")
    agent = sessions.get(state_db, "builder-a")
    events = open_events(project.events_db)
    try:
        result = run_turn(project, load_config(project.config_file, environ={}), state_db, events, agent, "hi",
                          "turn-1", resume_session_id=None, base_env={})
    finally:
        events.close()
    assert result.status == "permanent" and "provider 'gone'" in result.reason


# ---- every agent reaches its own endpoint -----------------------------------------------------------


def _tool_outputs(project: ProjectPaths, agent: str) -> str:
    return "\n".join(p.read_text() for p in (project.logs_dir / agent).glob("*/stdout.ndjson"))


def _commands(project: ProjectPaths, agent: str) -> list[list[str]]:
    return [json.loads(p.read_text()) for p in (project.logs_dir / agent).glob("*/command.json")]


def test_each_agent_gets_its_capability_provider_and_nothing_leaks_to_children(team: ProjectPaths,  # noqa: F811
                                                                               tmp_path: Path) -> None:
    write_local_config(team, runtime={"default": "scripted"}, turns={"retry_backoff": 0.05, "max_concurrent": 8},
                       providers=PROVIDERS, models={"coordinator": "mockc/x", "builder": "mockb/y"})
    path = team.ov_dir / "team.json"  # agents read it from inside their sandbox: .overstory/ is visible there
    show_env = {"bash": "echo ENDPOINT=$ANTHROPIC_BASE_URL KEY=$ANTHROPIC_API_KEY"}
    done = {"bash": 'ov mail send --type worker_done --subject done --body done'}
    scenario(path, {
        "coordinator": [{"actions": [show_env], "result": "ready"},
                        {"actions": [{"bash": sling_cmd("builder", "b", path)},
                                     {"bash": sling_cmd("scout", "s", path)}], "result": "slung"}],
        "builder-b": [{"actions": [show_env, done], "result": "done"}],
        "scout-s": [{"actions": [show_env, done], "result": "done"}],
    })
    env = {"MOCKC_KEY": "key-c", "MOCKB_KEY": "key-b", "ANTHROPIC_BASE_URL": "http://operator.invalid",
           "ANTHROPIC_API_KEY": "key-operator"}
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root, env=env).returncode == 0
    wait_idle(team, "coordinator", 1)
    assert run_ov("coordinator", "send", "go", cwd=team.root, env=env).returncode == 0
    assert wait_terminal(team, "builder-b").state == "completed"
    assert wait_terminal(team, "scout-s").state == "completed"

    assert "ENDPOINT=http://127.0.0.1:1/c KEY=key-c" in _tool_outputs(team, "coordinator")
    assert "ENDPOINT=http://127.0.0.1:1/b KEY=key-b" in _tool_outputs(team, "builder-b")
    # The scout has no provider: it gets the operator's endpoint, not its parent's.
    assert "ENDPOINT=http://operator.invalid KEY=key-operator" in _tool_outputs(team, "scout-s")
    for agent, model in (("coordinator", "x"), ("builder-b", "y")):
        for argv in _commands(team, agent):
            assert argv[argv.index("--model") + 1] == model
    # Nor its parent's model: the scout gets the default for scouts from `ov init`'s config.
    assert all(argv[argv.index("--model") + 1] == "haiku" for argv in _commands(team, "scout-s"))
    saved = json.loads((team.run_dir / "scout-s" / "env.json").read_text())
    assert saved["ANTHROPIC_BASE_URL"] == "http://operator.invalid" and "OVERSTORY_AGENT_NAME" not in saved
    conn = open_state(team.state_db)
    try:
        assert sessions.get(conn, "scout-s").parent == "coordinator"
    finally:
        conn.close()

