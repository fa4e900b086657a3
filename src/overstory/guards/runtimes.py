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

from _collections_abc import Mapping  # collections.abc's classes, without importing the collections package

from overstory import jsontext

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re

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


# ---- Gemini's AfterTool: a call's receipt ---------------------------------------------

GEMINI_SHELL = "run_shell_command"
# The lines Gemini CLI 0.61 puts after a shell command's output in the text the model gets (in this order,
# each only when it applies): "Output: <output or (empty)>", "Error: ...", "Exit Code: N" (only when not 0),
# "Signal: N", "Background PIDs: ...", "Process Group PGID: N"; all inside <untrusted_context>...</...>.
_GEMINI_SECTION = r"^(Error|Exit Code|Signal|Background PIDs|Process Group PGID): (.*)$"  # re: only here
_UNTRUSTED = ("<untrusted_context>\n", "\n</untrusted_context>")


def gemini_shell_outcome(response: object) -> tuple[bool, int | None, str]:
    """(succeeded, exit code, output) of a ``run_shell_command`` from its AfterTool ``tool_response``
    (``{llmContent, returnDisplay, error}``). Gemini's stream says "success" for any command that ran; the
    exit code is only in ``llmContent``. Fails closed: a text not in the shape above (cancelled, moved to
    the background, summarised) is a failure with no exit code, never a success."""
    if not isinstance(response, Mapping):
        return False, None, "ov: the outcome is unknown (no tool_response)"
    content, display = response.get("llmContent"), response.get("returnDisplay")
    if isinstance(content, list):
        content = "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
    if not isinstance(content, str):
        return False, None, "ov: the outcome is unknown (no text)"
    body = content
    if body.startswith(_UNTRUSTED[0]) and body.endswith(_UNTRUSTED[1]):
        body = body[len(_UNTRUSTED[0]):-len(_UNTRUSTED[1])]
    if not body.startswith("Output: "):
        return False, None, f"ov: the outcome is unknown: {content}"
    rest, output, tail = body[len("Output: "):], "", None
    shown = display.replace("</untrusted_context>", "&lt;/untrusted_context&gt;") if isinstance(display, str) else ""
    # Split off the output exactly where the display text (the same output) says where it ends, so that an
    # output line that looks like "Exit Code: 0" is not taken for the real one; else read the trailing lines.
    if shown.strip() and (rest == shown or rest.startswith(shown + "\n")):
        output, tail = str(display), rest[len(shown):]
    elif rest == "(empty)" or rest.startswith("(empty)\n"):
        tail = rest[len("(empty)"):]
    lines = rest.split("\n") if tail is None else tail.split("\n")
    sections: dict[str, str] = {}
    import re  # Gemini's receipts only: `ov guard` does not import re for other calls

    section = re.compile(_GEMINI_SECTION)
    for line in reversed(lines):  # the trailing section lines (all of the tail when it was split exactly)
        match = section.match(line)
        if match is None:
            if tail is not None and line:
                return False, None, f"ov: the outcome is unknown: {content}"
            if tail is None:
                break
            continue
        sections.setdefault(match.group(1), match.group(2))
    if tail is None:
        output = rest
    code = sections.get("Exit Code", "")
    if code.lstrip("-").isdigit():
        return False, int(code), output
    if "Exit Code" in sections or "Signal" in sections or "Error" in sections or response.get("error"):
        why = "; ".join(f"{k}: {v}" for k, v in sections.items() if k in ("Signal", "Error", "Exit Code"))
        return False, None, "\n".join(x for x in (why or str(response.get("error")), output) if x)
    return True, 0, output


def gemini_after_tool(hook_input: Mapping[str, object]) -> dict[str, object]:
    """Gemini CLI's AfterTool hook input (``{hook_event_name: "AfterTool", tool_name, tool_input,
    tool_response: {llmContent, returnDisplay, error}}``, no call id) as Claude's PostToolUse, or
    PostToolUseFailure for a failed call, in Claude's tool names. A shell command failed when it exited
    non-zero (``gemini_shell_outcome``); another tool when its response carries an error."""
    tool, args = hook_input.get("tool_name"), hook_input.get("tool_input")
    response = hook_input.get("tool_response")
    mapped: dict[str, object] = {"tool_name": tool, "tool_input": args}
    mapped["tool_name"], mapped["tool_input"] = _mapped(tool, args, GEMINI_TOOLS)
    if isinstance(hook_input.get("cwd"), str):
        mapped["cwd"] = hook_input["cwd"]
    if tool == GEMINI_SHELL:
        ok, code, output = gemini_shell_outcome(response)
        if ok:
            return {**mapped, "hook_event_name": "PostToolUse", "tool_response": {"stdout": output}}
        prefix = f"Exit code {code}\n" if code is not None else ""
        return {**mapped, "hook_event_name": "PostToolUseFailure", "error": prefix + output}
    error = response.get("error") if isinstance(response, Mapping) else None
    display = response.get("returnDisplay") if isinstance(response, Mapping) else None
    if error:
        message = error.get("message") if isinstance(error, Mapping) else error
        return {**mapped, "hook_event_name": "PostToolUseFailure", "error": str(message or error)}
    return {**mapped, "hook_event_name": "PostToolUse", "tool_response": display if isinstance(display, str) else ""}


def reply(dialect: str, allow: bool, reason: str, claude_response: str) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of ``ov guard`` for one decision."""
    if allow:
        return "", "", 0
    if dialect == GEMINI:
        return jsontext.dumps({"decision": "deny", "reason": reason}), "", 0
    if dialect in (OPENCODE, QWEN):
        return "", reason, 2
    return claude_response, "", 0


def unreadable(reason: str) -> tuple[str, str, int]:
    """The reply to an input whose dialect is unknown: exit 2 and the reason, a refusal for every CLI."""
    return "", reason, 2


# ---- codex's apply_patch ---------------------------------------------------------

_PATCH_PROGRAMS = ("apply_patch", "applypatch")
# Compiled by the first command that starts like apply_patch (``_patch_patterns``): no other needs re.
_HEREDOC = r"^\s*(?:apply_patch|applypatch)\s+<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[ \t]*\n(.*)\n[ \t]*\2\s*$"
_FILE_LINE = r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$"


def _patch_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    import re

    return re.compile(_HEREDOC, re.DOTALL), re.compile(_FILE_LINE, re.MULTILINE)


def patch_paths(command: str) -> list[str] | None:
    """The files an ``apply_patch`` command (codex's editing tool, run as a shell command) writes; None
    when ``command`` is not one. Handles the two forms codex models use: a heredoc and one argument."""
    if not command.lstrip().startswith(_PATCH_PROGRAMS):
        return None  # both forms start so (after spaces, which str.lstrip and the heredoc's \s* take alike)
    heredoc, file_line = _patch_patterns()
    match = heredoc.match(command)
    if match:
        body = match.group(3)
    else:
        stripped = command.lstrip()
        if not stripped.startswith(_PATCH_PROGRAMS):
            return None
        import shlex  # only for a command that starts like apply_patch: shlex compiles a pattern when imported

        try:
            words = shlex.split(stripped)
        except ValueError:
            return None
        if len(words) != 2 or words[0] not in _PATCH_PROGRAMS:
            return None
        body = words[1]
    if "*** Begin Patch" not in body:
        return None
    return file_line.findall(body)
