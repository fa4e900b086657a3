"""Rendering an agent's instructions: shipped role definitions plus the per-task overlay."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from overstory.agents.overlay import (
    CAPABILITIES,
    CONTEXT_KEYS,
    NO_FILE_SCOPE,
    NO_PROMPT,
    READ_ONLY,
    READ_WRITE,
    render_file_scope,
    render_instructions,
)
from overstory.errors import OrchestratorError, OverlayError, UnknownCapability
from overstory.resources import shipped_agents_dir, shipped_templates_dir

AGENTS = shipped_agents_dir()
TEMPLATES = shipped_templates_dir()


def context(capability: str = "builder", **changes: str) -> dict[str, str]:
    name = f"{capability}-parse-dates"
    values = {
        "agent_name": name,
        "capability": capability,
        "task_id": "parse-dates",
        "branch": f"ov/{name}",
        "base_branch": "main",
        "worktree": f"/project/.overstory/worktrees/{name}",
        "parent": "lead-dates",
        "prompt": "Make parse_date accept ISO weeks.",
        "file_scope": render_file_scope(["src/dates.py", "tests/test_dates.py"]),
    }
    values.update(changes)
    return values


def render(capability: str = "builder", **changes: str) -> str:
    return render_instructions(capability, context(capability, **changes), agents_dir=AGENTS, templates_dir=TEMPLATES)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_every_capability_renders_base_then_overlay(capability: str) -> None:
    text = render(capability)
    base = (AGENTS / f"{capability}.md").read_text()
    assert text.startswith(base.rstrip("\n"))
    overlay = text[len(base.rstrip("\n")):]
    for value in context(capability).values():
        if "\n" not in value:
            assert value in overlay
    assert "`src/dates.py`" in overlay
    assert re.search(r"\$\{?[A-Za-z_]", overlay) is None, "an unfilled placeholder is left"
    assert (READ_WRITE if capability in ("builder", "merger") else READ_ONLY) in overlay


@pytest.mark.parametrize(("capability", "must", "must_not"), [
    ("builder", ["--type worker_done", "git commit", "git add"], ["merge_ready"]),
    ("scout", ["--type worker_done"], ["git commit"]),
    ("reviewer", ["--type worker_done", "PASS", "FAIL"], ["git commit"]),
    ("lead", ["--type merge_ready --to lead-dates", "\"agent\": \"<builder name>\"", "--type worker_done"], []),
    ("merger", ["\"tier\": 3", "\"reason\":"], []),
    ("monitor", ["\"severity\": \"warning\""], []),
    ("merger", ["--type merged", "--type merge_failed"], ["--type worker_done"]),
    ("coordinator", ["--to lead-dates --type result", "--type status"], ["--type worker_done"]),
    ("monitor", ["--type escalation", "--type nudge"], ["--type worker_done"]),
])
def test_report_instructions_fit_the_capability(capability: str, must: list[str], must_not: list[str]) -> None:
    report = render(capability).split("## How to report", 1)[1]
    for needle in must:
        assert needle in report
    for needle in must_not:
        assert needle not in report


@pytest.mark.parametrize("key", CONTEXT_KEYS)
def test_a_missing_key_is_named(key: str) -> None:
    values = context()
    del values[key]
    with pytest.raises(OverlayError, match=key) as raised:
        render_instructions("builder", values, agents_dir=AGENTS, templates_dir=TEMPLATES)
    assert isinstance(raised.value, OrchestratorError)


def test_a_placeholder_only_a_custom_template_uses_must_be_given(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "overlay.md").write_text("Due by $deadline for $agent_name; costs $$5.\n")
    with pytest.raises(OverlayError, match="deadline"):
        render_instructions("scout", context("scout"), agents_dir=AGENTS, templates_dir=templates)
    text = render_instructions("scout", {**context("scout"), "deadline": "Friday"},
                               agents_dir=AGENTS, templates_dir=templates)
    assert text.endswith("Due by Friday for scout-parse-dates; costs $5.\n")


def test_a_broken_template_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "overlay.md").write_text("price: $ 5\n")
    with pytest.raises(OverlayError, match=r"\$\$"):
        render_instructions("scout", context("scout"), agents_dir=AGENTS, templates_dir=tmp_path)


def test_unknown_capability_lists_the_choices() -> None:
    with pytest.raises(UnknownCapability, match="architect") as raised:
        render_instructions("architect", context(), agents_dir=AGENTS, templates_dir=TEMPLATES)
    assert "builder" in str(raised.value)
    assert raised.value.exit_code == 2


def test_capability_in_context_must_agree() -> None:
    with pytest.raises(OverlayError, match="scout"):
        render_instructions("builder", context(capability="scout"), agents_dir=AGENTS, templates_dir=TEMPLATES)


def test_missing_role_definition_is_reported(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    shutil.copytree(AGENTS, agents)
    (agents / "merger.md").unlink()
    with pytest.raises(OverlayError, match="merger"):
        render_instructions("merger", context("merger"), agents_dir=agents, templates_dir=TEMPLATES)


def test_empty_prompt_and_scope_say_so() -> None:
    text = render(prompt="", file_scope="  ")
    assert NO_PROMPT in text
    assert NO_FILE_SCOPE in text
    assert render_file_scope([]) == NO_FILE_SCOPE


def test_dollar_signs_in_values_are_kept_verbatim() -> None:
    prompt = "Print $HOME and ${USER}, cost $5, keep $$ as is."
    assert prompt in render(prompt=prompt)


# --------------------------------------------------------------------------- role definitions


def test_one_role_definition_per_capability() -> None:
    assert sorted(p.stem for p in AGENTS.glob("*.md")) == sorted(CAPABILITIES)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_role_definitions_state_the_shared_rules(capability: str) -> None:
    text = (AGENTS / f"{capability}.md").read_text()
    assert 40 <= len(text.splitlines()) <= 90
    assert text.startswith(f"# Role: {capability}\n")
    for needle in ("git push", "worktree", "ov mail check", "ov sling", "Task"):
        assert needle in text, f"{capability}.md does not mention {needle!r}"
    if capability in ("builder", "merger"):
        assert "git commit" in text
    else:
        assert "Read-only" in text or "read-only" in text
    if capability in ("coordinator", "monitor"):
        assert "do not send `worker_done`" in text.lower() or "never finish with `worker_done`" in text


_PAYLOAD_COMMAND = re.compile(r"--type (\w+)((?:(?!ov mail send).)*?)--payload '(\{.*?\})'", re.DOTALL)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_payloads_in_the_instructions_are_valid(capability: str) -> None:
    """Every `--payload` an agent is told to send passes the mail protocol's validation."""
    from overstory.store.mail_payloads import PAYLOAD_MODELS, validate_payload

    text = render(capability).replace("\\\n", " ")
    found = _PAYLOAD_COMMAND.findall(text)
    for mail_type, _between, payload in found:
        assert mail_type in PAYLOAD_MODELS, mail_type
        validate_payload(mail_type, json.loads(payload), known={"task_id": "t", "branch": "ov/a", "agent": "a"})
    expected = {"lead": 2, "merger": 2, "monitor": 2, "builder": 1}.get(capability, 0)
    assert len(found) == expected


# ---- roles in the terms of the runtime an agent runs on ---------------------------

CLAUDE_ONLY_TOOLS = re.compile(r"\b(Task|Agent|SendMessage)\b")


@pytest.mark.parametrize("runtime", ["codex", "gemini", "opencode", "kilo", "qwen"])
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_roles_rendered_for_another_runtime_name_no_claude_only_tool(runtime: str, capability: str) -> None:
    from overstory.runtimes import get_runtime

    own = get_runtime(runtime).own_agent_tools
    text = render_instructions(capability, context(capability), agents_dir=AGENTS, templates_dir=TEMPLATES,
                               own_agent_tools=own)
    assert not CLAUDE_ONLY_TOOLS.search(text), CLAUDE_ONLY_TOOLS.search(text)
    assert own in " ".join(text.split()) and "ov sling" in text  # still told not to delegate by itself


def test_claude_roles_keep_claude_tool_names() -> None:
    from overstory.runtimes import get_runtime

    text = render_instructions("coordinator", context("coordinator"), agents_dir=AGENTS, templates_dir=TEMPLATES,
                               own_agent_tools=get_runtime("claude").own_agent_tools)
    assert "(Task, Agent, SendMessage, team creation)" in " ".join(text.split())
