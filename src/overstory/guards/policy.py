"""The decision for one PreToolUse call, and the reply `ov guard` prints.

``decide`` looks at the tool: blocked tools are refused, file-writing tools are checked
against the agent's writable places, and shell commands are split into simple commands,
each described by its handler and then judged here (``check_shell``). Anything that
fails inside an agent is denied, never let through.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from overstory.guards.agent import _NULL_SINKS, _Agent, _real
from overstory.guards.effects import _ShellState
from overstory.guards.programs import _analyze
from overstory.guards.shell import (
    _ASSIGNMENT,
    _HEADERS,
    _KEYWORDS,
    _SUBST,
    _WRITE_REDIRECTS,
    ShellCommand,
    _scan,
    _Unparseable,
    _words,
)

_DELEGATE = (
    "ov agents delegate with `ov sling <capability> <task-id>` and talk to other agents "
    "with `ov mail send`."
)
_OV_DRIVES_TURNS = (
    "ov drives your turns: end the turn when you are waiting; new mail starts the next one."
)

#: Tools denied for every agent, with the reason shown to the model. Extend freely.
BLOCKED_TOOLS: dict[str, str] = {
    "Task": f"Claude's sub-agents are disabled here: {_DELEGATE}",
    "Agent": f"Claude's sub-agents are disabled here: {_DELEGATE}",
    "TeamCreate": f"Claude's agent teams are disabled here: {_DELEGATE}",
    "TeamDelete": f"Claude's agent teams are disabled here: {_DELEGATE}",
    "SendMessage": f"Claude's team messages are disabled here: {_DELEGATE}",
    "Workflow": f"Claude's multi-agent workflows are disabled here: {_DELEGATE}",
    "RemoteTrigger": f"Remote agents are disabled here: {_DELEGATE}",
    "EnterWorktree": "ov manages your worktree: stay in it. Ask your parent with "
    "`ov mail send` if you need a different one.",
    "ExitWorktree": "ov manages your worktree: stay in it; `ov stop` and `ov merge` "
    "clean it up when you are done.",
    "CronCreate": f"Scheduled prompts are disabled here. {_OV_DRIVES_TURNS}",
    "CronDelete": f"Scheduled prompts are disabled here. {_OV_DRIVES_TURNS}",
    "ScheduleWakeup": f"Wake-ups are disabled here. {_OV_DRIVES_TURNS}",
    "Artifact": "Publishing outside the project is disabled here: report results to your "
    "parent with `ov mail send`.",
    "PushNotification": "Notifications are disabled here: report to your parent with "
    "`ov mail send`.",
}

#: File-writing tools and the tool_input key that holds the path they write.
FILE_WRITE_TOOLS: dict[str, str] = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}

#: Tools whose ``command`` is a shell command line.
SHELL_TOOLS = frozenset({"Bash", "Monitor"})

#: Tools that run code we cannot inspect (JavaScript, PowerShell).
CODE_TOOLS = frozenset({"REPL", "PowerShell"})


@dataclass(frozen=True)
class Decision:
    """Allow the tool call, or deny it with the reason shown to the model."""

    allow: bool
    reason: str = ""

    @classmethod
    def deny(cls, reason: str) -> Decision:
        return cls(False, reason)


ALLOW = Decision(True)


# --------------------------------------------------------------------------- entry points


def decide(hook_input: Mapping[str, object], env: Mapping[str, str]) -> Decision:
    """Decide one PreToolUse call. Fails closed inside an agent: a bug here denies."""
    agent_name = env.get("OVERSTORY_AGENT_NAME", "")
    if not agent_name:
        return ALLOW
    try:
        return _decide(hook_input, _Agent.from_env(agent_name, env))
    except Exception as exc:  # noqa: BLE001 - a crash would let the call through
        return Decision.deny(
            f"ov guard failed while checking this call ({type(exc).__name__}: {exc}); the "
            "call was blocked to be safe. Try a simpler form, or report it with `ov mail send`."
        )


def decide_hook_text(text: str | None, env: Mapping[str, str]) -> Decision:
    """Decide from the raw hook stdin. Unreadable input is denied inside an agent."""
    if not env.get("OVERSTORY_AGENT_NAME"):
        return ALLOW
    if text is None:
        return Decision.deny("ov guard could not read the hook input on stdin; call blocked.")
    try:
        data = json.loads(text)
    except ValueError:
        return Decision.deny(
            "ov guard received hook input that is not JSON, so it cannot check this call; "
            "call blocked."
        )
    if not isinstance(data, dict):
        return Decision.deny("ov guard expected a JSON object as hook input; call blocked.")
    return decide(data, env)


def hook_response(decision: Decision) -> str:
    """What `ov guard` prints: Claude's PreToolUse deny object, or nothing when allowed."""
    if decision.allow:
        return ""
    payload = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": decision.reason,
        }
    }
    return json.dumps(payload, separators=(",", ":"))


# --------------------------------------------------------------------------- tool dispatch


def _decide(hook_input: Mapping[str, object], agent: _Agent) -> Decision:
    event = hook_input.get("hook_event_name")
    if isinstance(event, str) and event and event != "PreToolUse":
        return ALLOW
    tool = hook_input.get("tool_name")
    if not isinstance(tool, str) or not tool:
        return Decision.deny("ov guard got hook input without a tool_name; call blocked.")
    tool_input = hook_input.get("tool_input")
    if tool_input is None:
        tool_input = {}
    if not isinstance(tool_input, dict):
        return Decision.deny(f"ov guard got a {tool} call whose tool_input is not an object.")

    if tool in BLOCKED_TOOLS:
        return Decision.deny(f"{tool} is not available to {agent.who}. {BLOCKED_TOOLS[tool]}")

    if tool in FILE_WRITE_TOOLS:
        if not agent.writable:
            return Decision.deny(agent.read_only(f"write files (the {tool} tool)"))
        key = FILE_WRITE_TOOLS[tool]
        path = tool_input.get(key)
        if not isinstance(path, str) or not path:
            return Decision.deny(f"{tool} call without a {key}; nothing to check, call blocked.")
        reason = agent.write_denial(path, agent.start_dir(hook_input))
        return Decision.deny(reason) if reason else ALLOW

    if tool in SHELL_TOOLS:
        command = tool_input.get("command")
        if command is None and tool != "Bash":
            return ALLOW  # e.g. Monitor watching a websocket
        if not isinstance(command, str):
            return Decision.deny(f"{tool} call without a command string; call blocked.")
        reason = check_shell(command, agent, agent.start_dir(hook_input))
        return Decision.deny(reason) if reason else ALLOW

    if tool in CODE_TOOLS and not agent.writable:
        return Decision.deny(
            agent.read_only(f"run the {tool} tool, whose code cannot be checked for writes")
        )
    return ALLOW


# --------------------------------------------------------------------------- shell policy

_MAX_DEPTH = 8


def check_shell(script: str, agent: _Agent, cwd: str | None, depth: int = 0) -> str | None:
    """Why ``script`` is refused for ``agent``, or None when it may run."""
    if depth > _MAX_DEPTH:
        return "this command nests shells or substitutions too deeply to check; simplify it."
    try:
        segments, _ = _scan(script, 0, inside=False)
        commands = [_words(segment) for segment in segments]
    except _Unparseable as exc:
        return (
            f"ov guard could not parse this shell command ({exc}), so it cannot check it. "
            "Split it into simpler commands."
        )
    state = _ShellState(cwd)
    for command in commands:
        reason = _check_command(command, agent, state, depth)
        if reason:
            return reason
    return None


def _check_command(
    command: ShellCommand, agent: _Agent, state: _ShellState, depth: int
) -> str | None:
    for op, target in command.redirects:
        writes = op in _WRITE_REDIRECTS or (
            op == ">&" and not (target.isdigit() or target == "-")
        )
        if not writes:
            continue
        if not agent.writable:
            if target in _NULL_SINKS or target.startswith("/dev/fd/"):
                continue
            return agent.read_only(
                f"redirect output into a file (`{op} {target}`); only `>/dev/null`, "
                "`2>/dev/null` and `2>&1` are allowed"
            )
        reason = agent.write_denial(target, state.cwd)
        if reason:
            return reason
    argv = list(command.argv)
    while argv and argv[0] in _KEYWORDS:
        argv.pop(0)
    if argv and argv[0] in _HEADERS:
        return None
    assignments: dict[str, str] = {}
    while argv and _ASSIGNMENT.match(argv[0]):
        key, _, value = argv.pop(0).partition("=")
        assignments[key.rstrip("+")] = value
    if not argv:
        return None
    return _check_argv(argv, agent, state, depth, assignments)


def _check_argv(
    argv: list[str],
    agent: _Agent,
    state: _ShellState,
    depth: int,
    assignments: Mapping[str, str] | None = None,
) -> str | None:
    if depth > _MAX_DEPTH:
        return "this command nests wrappers too deeply to check; simplify it."
    program = argv[0]
    if _SUBST in program or program.startswith("$") or "`" in program:
        if agent.writable:
            return None
        return agent.read_only(f"run a command whose name is computed at run time (`{program}`)")
    name = os.path.basename(program)
    if name in ("cd", "pushd"):
        _change_dir(argv, agent, state)
        return None
    if name == "popd":
        state.cwd = None
        return None

    effect = _analyze(name, argv, agent, state, assignments or {})
    if effect.kind == "deny":
        return effect.reason

    inner_state = state
    if effect.chdir is not None:
        inner_state = _ShellState(agent.expand(effect.chdir, state.cwd))
    for inner in effect.inner:
        if inner:
            reason = _check_argv(inner, agent, _ShellState(inner_state.cwd), depth + 1)
            if reason:
                return reason
    for script in effect.scripts:
        reason = check_shell(script, agent, inner_state.cwd, depth + 1)
        if reason:
            return reason

    if not agent.writable:
        if effect.kind in ("read", "test"):
            return None
        if effect.kind in ("write", "install"):
            return agent.read_only(effect.what or f"run `{name}`, which writes files")
        if effect.kind == "code":
            return agent.read_only(
                f"run {effect.what or name}: code that cannot be checked for writes"
            )
        return agent.read_only(
            f"run `{name}`, which is not on its list of read-only commands (cat, ls, grep, rg, "
            "find, head, tail, wc, git status/log/diff/show, ov, pytest …)"
        )

    if effect.kind == "install":
        return (
            f"{agent.who} may not install packages outside its worktree: {effect.what}. Use a "
            f"virtualenv or local node_modules inside {agent.worktree}, or ask your parent "
            "with `ov mail send`."
        )
    for target in effect.targets:
        reason = agent.write_denial(target, inner_state.cwd, removes=effect.removes)
        if reason:
            return reason
    if effect.writes_cwd and inner_state.cwd is not None:
        reason = agent.write_denial(inner_state.cwd, None)
        if reason:
            return reason
    if effect.kind in ("unknown", "code"):
        return agent.protected_zone_denial(argv[1:], state.cwd)
    return None


def _change_dir(argv: list[str], agent: _Agent, state: _ShellState) -> None:
    args = [a for a in argv[1:] if not (a.startswith("-") and a != "-")]
    if not args:
        home = agent.env.get("HOME")
        state.cwd = _real(home) if home else None
    elif args[0] == "-":
        state.cwd = None
    else:
        state.cwd = agent.expand(args[0], state.cwd)
