"""The decision for one PreToolUse call, and the reply `ov guard` prints.

``decide`` looks at the tool: blocked tools are refused, file-writing tools are checked
against the agent's writable places, and shell commands go to ``walk.check_shell``,
which splits them into simple commands, each described by its handler and then judged.
Anything that fails inside an agent is denied, never let through.
"""

from __future__ import annotations

from overstory import jsontext
from overstory.guards.agent import _Agent
from overstory.guards.runtimes import as_claude_input, patch_paths, reply, unreadable
from overstory.guards.shell import _SUBST
from overstory.guards.walk import check_shell

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

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

#: An `ov loop` phase's tool allow-list (comma-separated, Claude's tool names), set for its turns.
PHASE_TOOLS_ENV = "OVERSTORY_PHASE_TOOLS"
MAIL_POLLING_ENV = "OVERSTORY_MAIL_POLLING"  # "refuse" (config guards.mail_polling): see guards.mail_poll

#: Tools whose ``command`` is a shell command line.
SHELL_TOOLS = frozenset({"Bash", "Monitor"})

#: Tools that run code we cannot inspect (JavaScript, PowerShell).
CODE_TOOLS = frozenset({"REPL", "PowerShell"})


class Decision:
    """Allowed, or denied with the reason shown to the model. Immutable."""

    __slots__ = ("allow", "reason")
    allow: bool
    reason: str

    def __init__(self, allow: bool, reason: str = "") -> None:
        object.__setattr__(self, "allow", allow)
        object.__setattr__(self, "reason", reason)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Decision is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decision) and (self.allow, self.reason) == (other.allow, other.reason)

    def __hash__(self) -> int:
        return hash((self.allow, self.reason))

    def __repr__(self) -> str:
        return f"Decision(allow={self.allow!r}, reason={self.reason!r})"

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
        data = jsontext.loads(text)
    except ValueError:
        return Decision.deny(
            "ov guard received hook input that is not JSON, so it cannot check this call; "
            "call blocked."
        )
    if not isinstance(data, dict):
        return Decision.deny("ov guard expected a JSON object as hook input; call blocked.")
    return decide(data, env)


def guard_reply(text: str | None, env: Mapping[str, str], *,
                count_call: Callable[[], str | None] | None = None,
                record: Callable[[Mapping[str, object], Decision], Decision] | None = None) -> tuple[str, str, int]:
    """`ov guard`'s whole answer to one hook call, in the dialect of the CLI that asked:
    (stdout, stderr, exit status). See ``guards.runtimes``.

    ``count_call`` runs for a call the policy allows (the budget's tool-call count, kept
    outside this standard-library-only package); a reason it returns denies the call.
    ``record`` then gets the call (in Claude's shape) and the decision, and returns the
    final one: the tool-call ledger (``agents.ledger``) writes its row there and may deny
    a replay of a side effect that already happened.
    """
    if not env.get("OVERSTORY_AGENT_NAME"):
        return "", "", 0
    try:
        data = jsontext.loads(text) if text is not None else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return unreadable(decide_hook_text(text, env).reason)
    dialect, claude_input = as_claude_input(data)
    decision = decide(claude_input, env)
    if decision.allow and count_call is not None:
        refusal = count_call()
        if refusal:
            decision = Decision.deny(refusal)
    if record is not None:
        decision = record(claude_input, decision)
    return reply(dialect, decision.allow, decision.reason, hook_response(decision))


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
    return jsontext.dumps(payload, separators=(",", ":"))


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

    phase_tools = agent.env.get(PHASE_TOOLS_ENV)
    if phase_tools is not None and tool not in phase_tools.split(","):
        phase = agent.env.get("OVERSTORY_LOOP_PHASE") or "this phase"
        return Decision.deny(
            f"{tool} is not allowed in phase {phase!r} of your loop; its spec allows only "
            f"{', '.join(filter(None, phase_tools.split(','))) or 'no tools'}. Do this phase's work with "
            "those; later phases may allow more."
        )

    if tool in FILE_WRITE_TOOLS:
        if not agent.writable:
            return Decision.deny(agent.read_only(f"write files (the {tool} tool)"))
        key = FILE_WRITE_TOOLS[tool]
        path = tool_input.get(key)
        if not isinstance(path, str) or not path or _SUBST in path or "\x00" in path:
            return Decision.deny(f"{tool} call without a usable {key}; nothing to check, call blocked.")
        reason = agent.write_denial(path, agent.start_dir(hook_input))
        return Decision.deny(reason) if reason else ALLOW

    if tool in SHELL_TOOLS:
        command = tool_input.get("command")
        if command is None and tool != "Bash":
            return ALLOW  # e.g. Monitor watching a websocket
        if not isinstance(command, str):
            return Decision.deny(f"{tool} call without a command string; call blocked.")
        patched = patch_paths(command)
        if patched is not None:  # codex edits files by running apply_patch
            return _check_patch(patched, agent, agent.start_dir(hook_input))
        reason = check_shell(command, agent, agent.start_dir(hook_input))
        if reason is None and agent.env.get(MAIL_POLLING_ENV) == "refuse":  # opt-in: nothing to import otherwise
            from overstory.guards.mail_poll import REFUSAL, polls_mail

            reason = REFUSAL if polls_mail(command) else None
        return Decision.deny(reason) if reason else ALLOW

    if tool in CODE_TOOLS and not agent.writable:
        return Decision.deny(
            agent.read_only(f"run the {tool} tool, whose code cannot be checked for writes")
        )
    return ALLOW


def _check_patch(paths: list[str], agent: _Agent, cwd: str | None) -> Decision:
    if not agent.writable:
        return Decision.deny(agent.read_only("edit files (apply_patch)"))
    for path in paths:
        reason = agent.write_denial(path, cwd)
        if reason:
            return Decision.deny(reason)
    return ALLOW
