"""Other CLIs' pre-tool hook input, read as Claude's (which ``decide`` understands), and their replies.

One ``ov guard`` serves every runtime; it tells them apart by the input's shape:

- Claude Code and Codex: ``{hook_event_name: "PreToolUse", tool_name, tool_input, cwd}``.
  Codex reports every shell command, ``apply_patch`` edits included, as ``Bash``; the
  patch is in the command's heredoc, so its file paths are read here (``patch_paths``).
- Gemini CLI (``BeforeTool`` hook): ``{hook_event_name: "BeforeTool", tool_name, tool_input,
  cwd}`` with Gemini's tool names (``run_shell_command``, ``write_file``, ``replace``...).
  It denies on ``{"decision": "deny", "reason": ...}``.
- Qwen Code (``PreToolUse`` hook): Claude's shape with Qwen's tool names (``run_shell_command``,
  ``write_file``, ``edit``...) and a ``tool_call_id`` that is its stream's id for the call (its
  ``tool_use_id`` is not). It refuses a call on exit 2 with the reason on stderr; exit 1 lets
  the call run (measured), which the hook command turns into exit 2.
- OpenCode and Kilo (ov's plugin, ``tool.execute.before``): ``{tool, args, sessionID, callID, cwd}``
  with OpenCode's tool names (``bash``, ``write``, ``edit``...). The plugin blocks the
  call when ``ov guard`` exits non-zero, with stderr as the reason.

An input that cannot be read at all is denied with exit 2 and the reason on stderr,
which every one of these CLIs treats as a refusal. Standard library only (hot path).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

CLAUDE = "claude"
GEMINI = "gemini"
OPENCODE = "opencode"
QWEN = "qwen"

# Their tool -> (Claude's tool, {their argument: Claude's argument}).
GEMINI_TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "run_shell_command": ("Bash", {"command": "command"}),
    "write_file": ("Write", {"file_path": "file_path"}),
    "replace": ("Edit", {"file_path": "file_path"}),
    "invoke_agent": ("Agent", {}),
}
QWEN_TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "run_shell_command": ("Bash", {"command": "command"}),
    "write_file": ("Write", {"file_path": "file_path"}),
    "edit": ("Edit", {"file_path": "file_path"}),
    "notebook_edit": ("NotebookEdit", {}),
    "agent": ("Agent", {}),
}
OPENCODE_TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "bash": ("Bash", {"command": "command"}),
    "write": ("Write", {"filePath": "file_path"}),
    "edit": ("Edit", {"filePath": "file_path"}),
    "multiedit": ("MultiEdit", {"filePath": "file_path"}),
    "task": ("Task", {}),
}


def dialect_of(hook_input: Mapping[str, object]) -> str:
    if hook_input.get("hook_event_name") == "BeforeTool":
        return GEMINI
    if "tool_name" not in hook_input and isinstance(hook_input.get("tool"), str):
        return OPENCODE
    if "tool_call_id" in hook_input or hook_input.get("tool_name") in QWEN_TOOLS:
        return QWEN
    return CLAUDE


def _mapped(tool: object, args: object, table: Mapping[str, tuple[str, dict[str, str]]]) -> tuple[object, object]:
    """(Claude's tool, Claude's arguments) of one of their calls; unknown tools as they are."""
    if not isinstance(tool, str) or tool not in table:
        return tool, args
    claude_tool, keys = table[tool]
    return claude_tool, ({keys.get(key, key): value for key, value in args.items()} if isinstance(args, dict) else args)


def gemini_call(tool: str, args: dict[str, object]) -> tuple[str, dict[str, object]]:
    """A Gemini CLI call as its BeforeTool hook reaches ``ov guard``: in Claude's names."""
    claude_tool, claude_args = _mapped(tool, args, GEMINI_TOOLS)
    return str(claude_tool), claude_args if isinstance(claude_args, dict) else {}


def as_claude_input(hook_input: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """(dialect, the same call in Claude's PreToolUse shape)."""
    dialect = dialect_of(hook_input)
    if dialect == CLAUDE:
        return dialect, dict(hook_input)
    if dialect == GEMINI:
        tool, args, table = hook_input.get("tool_name"), hook_input.get("tool_input"), GEMINI_TOOLS
    elif dialect == QWEN:
        tool, args, table = hook_input.get("tool_name"), hook_input.get("tool_input"), QWEN_TOOLS
    else:
        tool, args, table = hook_input.get("tool"), hook_input.get("args"), OPENCODE_TOOLS
    mapped: dict[str, object] = {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": args}
    if isinstance(hook_input.get("cwd"), str):
        mapped["cwd"] = hook_input["cwd"]
    if dialect == OPENCODE and isinstance(hook_input.get("callID"), str):  # the stream's id for the same call:
        mapped["tool_use_id"] = hook_input["callID"]  # its receipt finds the ledger row by it (Gemini's has none)
    if dialect == QWEN and isinstance(hook_input.get("tool_call_id"), str):
        mapped["tool_use_id"] = hook_input["tool_call_id"]  # the stream's id (its tool_use_id is another)
    mapped["tool_name"], mapped["tool_input"] = _mapped(tool, args, table)
    return dialect, mapped


def reply(dialect: str, allow: bool, reason: str, claude_response: str) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of ``ov guard`` for one decision."""
    if allow:
        return "", "", 0
    if dialect == GEMINI:
        return json.dumps({"decision": "deny", "reason": reason}), "", 0
    if dialect in (OPENCODE, QWEN):
        return "", reason, 2
    return claude_response, "", 0


def unreadable(reason: str) -> tuple[str, str, int]:
    """The reply to an input whose dialect is unknown: exit 2 and the reason, a refusal for every CLI."""
    return "", reason, 2


# ---- codex's apply_patch ---------------------------------------------------------

_PATCH_PROGRAMS = ("apply_patch", "applypatch")
_HEREDOC = re.compile(r"^\s*(?:apply_patch|applypatch)\s+<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[ \t]*\n(.*)\n[ \t]*\2\s*$",
                      re.DOTALL)
_FILE_LINE = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$", re.MULTILINE)


def patch_paths(command: str) -> list[str] | None:
    """The files an ``apply_patch`` command (codex's editing tool, run as a shell command) writes; None
    when ``command`` is not one. Handles the two forms codex models use: a heredoc and one argument."""
    match = _HEREDOC.match(command)
    if match:
        body = match.group(3)
    else:
        stripped = command.lstrip()
        if not stripped.startswith(_PATCH_PROGRAMS):
            return None
        try:
            words = shlex.split(stripped)
        except ValueError:
            return None
        if len(words) != 2 or words[0] not in _PATCH_PROGRAMS:
            return None
        body = words[1]
    if "*** Begin Patch" not in body:
        return None
    return _FILE_LINE.findall(body)
