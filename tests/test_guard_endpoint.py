"""`ov guard` inside a turn asks the agent's loop (endpoint route ``guard``) and prints its answer as is.

The loop already has the guard's modules loaded, so the hook process stays a light client
(tests/test_fast_cli.py checks what it imports). These tests hold the answers to what the
guard decides in its own process: the same stdout, stderr and exit status for every CLI's
dialect; and when the endpoint cannot be reached, a refusal (fail closed: the call could be
neither counted nor recorded).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import typing as t

import pytest

from overstory.endpoint.routes import ROUTES
from overstory.endpoint.server import AgentEndpoint
from overstory.store.db import open_state
from test_fast_cli import AGENT_ENV, World, build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory)


OV = [sys.executable, "-c", "from overstory.cli import fast; fast.main()"]


def _counting_routes() -> tuple[dict[str, t.Any], list[str]]:
    """The endpoint's routes, noting each ``guard`` request it answers (so a test knows the loop was asked)."""
    asked: list[str] = []

    @functools.wraps(ROUTES["guard"])
    def guard(caller: t.Any, args: dict[str, t.Any]) -> t.Any:
        asked.append(args["text"])
        return ROUTES["guard"](caller, args)

    return {**ROUTES, "guard": guard}, asked


def _calls(world: World) -> list[tuple[str, dict[str, object]]]:
    wt, root = str(world.worktree), str(world.project.root)
    inside, outside = f"{wt}/notes.txt", f"{root}/README.md"
    claude = {"session_id": "s", "cwd": wt, "hook_event_name": "PreToolUse", "tool_use_id": "toolu_1"}
    return [
        ("claude: read", {**claude, "tool_name": "Read", "tool_input": {"file_path": outside}}),
        ("claude: write inside", {**claude, "tool_name": "Write", "tool_input": {"file_path": inside, "content": "x"}}),
        ("claude: write the checkout", {**claude, "tool_name": "Write",
                                        "tool_input": {"file_path": outside, "content": "x"}}),
        ("claude: git push", {**claude, "tool_name": "Bash", "tool_input": {"command": "git push origin main"}}),
        ("claude: blocked tool", {**claude, "tool_name": "Agent", "tool_input": {"prompt": "help"}}),
        ("gemini: shell write outside", {"session_id": "s", "cwd": wt, "hook_event_name": "BeforeTool",
                                         "tool_name": "run_shell_command",
                                         "tool_input": {"command": f"echo x > {outside}"}}),
        ("gemini: read", {"session_id": "s", "cwd": wt, "hook_event_name": "BeforeTool", "tool_name": "read_file",
                          "tool_input": {"absolute_path": outside}}),
        ("opencode: edit outside", {"tool": "edit", "sessionID": "ses", "callID": "c", "cwd": wt,
                                    "args": {"filePath": outside, "oldString": "a", "newString": "b"}}),
        ("codex: apply_patch outside", {**claude, "tool_name": "Bash", "tool_input": {
            "command": f"apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: {outside}\n+x\n*** End Patch\nEOF\n"}}),
    ]


def _guard(world: World, hook_input: dict[str, object] | str, extra: dict[str, str]) -> tuple[str, str, int]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}, **AGENT_ENV,
           "OVERSTORY_PROJECT_ROOT": str(world.project.root), "OVERSTORY_WORKTREE": str(world.worktree), **extra}
    text = hook_input if isinstance(hook_input, str) else json.dumps(hook_input)
    done = subprocess.run([*OV, "guard"], input=text, capture_output=True, text=True, env=env,
                          cwd=world.worktree, timeout=60, check=False)
    return done.stdout, done.stderr, done.returncode


def _counted(world: World) -> int:
    state = open_state(world.project.state_db)
    try:
        return int(state.execute("SELECT tool_calls FROM budgets WHERE name = 'builder-a'").fetchone()[0])
    finally:
        state.close()


@pytest.mark.parametrize("index", range(9))
def test_the_loop_answers_as_the_guard_process_would(world: World, index: int) -> None:
    label, hook_input = _calls(world)[index]
    world.restore()
    alone = _guard(world, hook_input, {})
    counted_alone = _counted(world)
    world.restore()
    routes, requests = _counting_routes()
    endpoint = AgentEndpoint(world.project, "builder-a", 1, routes).start()
    try:
        asked = _guard(world, hook_input, endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": "t-1"}))
    finally:
        endpoint.close()
    assert len(requests) == 1, "the loop judged the call"
    assert asked == alone, label
    assert _counted(world) == counted_alone, label  # counted once, in the same place, either way
    allowed = alone[0] == "" and alone[2] == 0
    assert allowed == label.endswith(("read", "write inside")), (label, alone)


def test_an_unreadable_hook_input_gets_the_same_refusal_through_the_loop(world: World) -> None:
    world.restore()
    alone = _guard(world, "{not json", {})
    routes, requests = _counting_routes()
    endpoint = AgentEndpoint(world.project, "builder-a", 1, routes).start()
    try:
        asked = _guard(world, "{not json", endpoint.open_turn())
    finally:
        endpoint.close()
    assert requests == ["{not json"]
    assert asked == alone and alone[2] == 2 and alone[1].strip()


@pytest.mark.parametrize("index", range(9))
def test_with_the_loop_gone_every_call_is_refused_and_nothing_is_counted(world: World, index: int) -> None:
    """Fail closed (issue 28): the turn's variables name an endpoint that no longer answers (its loop died), so
    nothing can count the call against the budget or record it in the ledger: it is refused, in the asking
    CLI's dialect. A call the guard refuses anyway keeps the guard's own reason."""
    label, hook_input = _calls(world)[index]
    world.restore()
    alone = _guard(world, hook_input, {})
    world.restore()
    before = world.dump()
    endpoint = AgentEndpoint(world.project, "builder-a", 1, ROUTES).start()
    turn = endpoint.open_turn()
    endpoint.close()
    gone = _guard(world, hook_input, turn)
    assert world.dump() == before, "nothing counted, nothing recorded"
    if alone[0] == "" and alone[2] == 0:  # allowed when ov can be asked: refused now
        assert gone != alone and "ov could not be reached to count and record this call" in gone[0] + gone[1], label
        assert "\n" not in (gone[0] + gone[1]).strip(), "one line"
    else:
        assert gone == alone, label


def test_a_wrong_secret_is_not_answered_and_the_call_is_refused(world: World) -> None:
    world.restore()
    routes, requests = _counting_routes()
    endpoint = AgentEndpoint(world.project, "builder-a", 1, routes).start()
    try:
        turn = endpoint.open_turn()
        forged = {**turn, "OVERSTORY_ENDPOINT_TOKEN": "0" * 48}
        replies = [_guard(world, dict(_calls(world))[label], forged) for label in ("claude: git push", "claude: read")]
    finally:
        endpoint.close()
    assert requests == []
    for stdout, _, status in replies:
        assert status == 0 and json.loads(stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "could not be reached" in replies[1][0]
